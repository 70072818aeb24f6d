"""The backend's former entry-point target: installs made before the compile
package (their metadata names ``torch_neuronx._dynamo:neuron_backend``) still
find it. pyproject.toml names torch_neuronx._compile.dynamo; delete this file
once no such install is in use."""
from ._compile.dynamo import neuron_backend  # noqa: F401
