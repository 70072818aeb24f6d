#include "Target.h"

#include <cstdlib>
#include <cstring>

namespace neuronrt {
namespace {

// Sources: AWS Neuron documentation, "Neuron hardware" (Trainium, Trainium2,
// Trainium3 architecture pages). Trn2 exposes 4 logical cores per chip at its
// default logical-NeuronCore size 2.
TargetModel model(const std::string& name) {
  if (name == "trn1") return {"trn1", "NeuronCore-v2", 2, 2, size_t{16} << 30};  // 32 GiB / 2
  if (name == "trn2") return {"trn2", "NeuronCore-v3", 3, 4, size_t{24} << 30};  // 96 GiB / 4
  if (name == "trn3") return {"trn3", "NeuronCore-v4", 4, 8, size_t{18} << 30};  // 144 GiB / 8
  return {};
}

struct Selection {
  TargetModel target;
  bool strict = false;
  std::string error;
};

const Selection& selection() {
  static const Selection s = [] {
    Selection out;
    out.target = {"", "NeuronCore-v3", 3, 2, size_t{16} << 30};
    const char* t = std::getenv("NEURON_RT_TARGET");
    if (t && *t) {
      TargetModel m = model(t);
      if (m.name.empty()) {
        out.error = std::string("NEURON_RT_TARGET='") + t + "' is invalid. Accepted: trn1, trn2 or trn3.";
      } else {
        out.target = m;
      }
    }
    const char* strict = std::getenv("NEURON_RT_STRICT");
    if (strict && *strict) {
      if (std::strcmp(strict, "1") == 0) {
        out.strict = true;
      } else if (std::strcmp(strict, "0") != 0) {
        if (!out.error.empty()) out.error += "\n";
        out.error += std::string("NEURON_RT_STRICT='") + strict + "' is invalid. Accepted: 0 or 1.";
      }
    }
    if (out.strict && out.target.name.empty() && out.error.empty()) out.target = model("trn2");
    return out;
  }();
  return s;
}

}  // namespace

const TargetModel& target() noexcept { return selection().target; }
bool strict() noexcept { return selection().strict; }
const std::string& target_error() noexcept { return selection().error; }

}  // namespace neuronrt
