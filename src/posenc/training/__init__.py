"""Training: the loop, where it starts (scratch, resume, fine-tune), the losses shared with
evaluation, and the optimizer."""
