"""Compute on a GPU you do not own: the GPUs' specifications (specs), each layer's operators (ops), what each costs
on a device (kernels, layers), the host that launches them (host), and the parameters learned from public
measurements (model)."""
