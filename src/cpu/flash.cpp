// placeholder: being written
#include "cpu/cpu_kernels.h"
namespace flashlab {
namespace { std::string no(const AttnParams&) { return "not built yet"; }
std::string nf(const FwdParams& p) { return no(p); } std::string nb(const BwdParams& p) { return no(p); } }
KernelEntry cpu_flash_entry() { KernelEntry e; e.info = {"cpu_flash", "cpu", "placeholder", false, false}; e.supports_fwd = nf; e.supports_bwd = nb; return e; }
}
