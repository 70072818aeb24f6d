// The row kernels for the baseline instruction set (see Kernels.inc).
#include "Kernels.h"

namespace neuronrt::nki::detail::generic {
#include "Kernels.inc"
}  // namespace neuronrt::nki::detail::generic
