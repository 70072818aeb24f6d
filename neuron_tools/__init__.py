"""``neuron-ls`` and ``neuron-top``: the host's NeuronCores and the processes using
them, read from the runtime's per-host registry without importing torch (so
they start at once)."""
