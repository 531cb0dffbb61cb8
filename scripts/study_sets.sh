# The runs of the study beyond each experiment's own sweep (configs/experiment/*.yaml):
# the options run beside their encodings' default forms, and RoPE's test-time scalings. Sourced by
# scripts/study.sh (the CPU) and scripts/gpu/run.sh (the GPU machine). A variant is one encoding
# and its options: a multirun over pe=a,b cannot override a key the default pe lacks.
# shellcheck disable=SC2034  # read by the scripts that source it
# compare's options worth comparing, each beside its encoding's default form
VARIANTS=(
  "pe=alibi pe.encoder_bias=symmetric"       # the symmetric encoder forms, as variants (one
  "pe=kerple pe.encoder_bias=symmetric"      #   encoding per call: a multirun over pe=a,b cannot
                                             #   override a key the default pe lacks)
  "pe=rope pe.rotary_fraction=0.5"           # partial rotation (transformers' partial_rotary_factor)
  "pe=rope pe.rope_proportion=0.75"          # p-RoPE (Barbero et al. 2025)
  "pe=rope pe.cross_attention=rotated"       # RoPE in cross-attention too (x-transformers' context_pos)
  "pe=sinpe pe.augment=shift pe.augment_range=100"  # SHAPE (Kiyono et al. 2021)
  "pe=alibi pe.dape=true"                    # DAPE (Zheng et al. 2024)
)
# extrapolation's options: those of compare that are about length (the symmetric encoder
# forms are left to compare) and position augmentation where it applies, whose random positions
# cover the test lengths (sources up to 120 tokens, targets up to 1.5 x 120 + 10)
EXTRAP_VARIANTS=(
  "pe=rope pe.rotary_fraction=0.5"
  "pe=rope pe.rope_proportion=0.75"
  "pe=rope pe.cross_attention=rotated"
  "pe=alibi pe.dape=true"
  "pe=rope pe.augment=random pe.augment_range=256"     # randomized positions (Ruoss et al. 2023)
  "pe=learned pe.augment=random pe.augment_range=256"  # every table row trained
  "pe=t5 pe.augment=random pe.augment_range=256"
  "pe=sinpe pe.augment=shift pe.augment_range=100"     # SHAPE (Kiyono et al. 2021)
)
# RoPE's context-extension scalings at test time, on each trained rope run (configs/experiment/
# extrapolation.yaml): PI, NTK, YaRN and dynamic NTK, each at factor 4
ROPE_SCALINGS="eval.pe_variants={pi4: {scaling: linear, factor: 4}, ntk4: {scaling: ntk, factor: 4}, \
yarn4: {scaling: yarn, factor: 4, original_max_len: 32}, \
dntk4: {scaling: dynamic_ntk, factor: 4, original_max_len: 32}}"
# scaling's options worth comparing on model=small's three layers a stack
SCALING_VARIANTS=(
  "pe=rope pe.off_layers=[2]"  # RoPE/NoPE interleaving (Yang et al. 2025), three RoPE : one NoPE
  "pe=rope pe.cross_attention=rotated"  # compare's best system (seeds 0-2): does its lead hold?
)
# the seed report's setting (configs/experiment/seed_report.yaml: the report's four) with ALiBi
SEED_REPORT_PES=nonepe,sinpe,rpe,rope,alibi
# depth's options (configs/experiment/depth.yaml: model=base on a GPU)
DEPTH_VARIANTS=(
  "pe=rope pe.cross_attention=rotated"  # compare's best system at the depth of a real model
)
