"""The network. Positional encodings, the one attention module, layers and stacks, the
``nn.Transformer``-based Seq2Seq, and the factory that builds it from a configuration."""
