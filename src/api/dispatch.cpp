// Dispatch: the public entry points. Each validates its Args into Params (validate.cpp),
// picks the registry entry that runs them (the named kernel, or under "auto" the
// highest-priority kernel that supports the call), checks the caller's workspace and runs
// the entry unless there is nothing to write.
//
// The success path builds no string and allocates nothing after the first call (which sorts
// the registry for "auto"): "auto" asks kernels in priority order and stops at the first
// that supports the call, skips kernels whose arch cannot reach the tensors' device or that
// lack dropout without asking them (a refusal is a string), and writes the list of every
// kernel's reason only when all of them refuse.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "api/validate.h"
#include "common/registry.h"

namespace flashlab {
namespace {

using api::invalid;

// The forward or the backward half of a registry entry.
template <class P>
struct Half {
  bool takes_dropout;
  std::string (*supports)(const P&);
  size_t (*workspace)(const P&);  // nullptr: needs none
  Status (*run)(const P&);        // nullptr: the entry has no such pass
};
Half<FwdParams> half(const KernelEntry& e, const FwdParams&) {
  return {e.info.forward_dropout, e.supports_fwd, e.workspace_fwd, e.run_fwd};
}
Half<BwdParams> half(const KernelEntry& e, const BwdParams&) {
  return {e.info.backward_dropout, e.supports_bwd, e.workspace_bwd, e.run_bwd};
}
Half<KvCacheParams> half(const KernelEntry& e, const KvCacheParams&) {
  return {false, e.supports_kv, e.workspace_kv, e.run_kv};
}
const char* pass_name(const FwdParams&) { return "forward"; }
const char* pass_name(const BwdParams&) { return "backward"; }
const char* pass_name(const KvCacheParams&) { return "KV-cache forward"; }

// Why `e` cannot run `p` ("" when it can): the registry's flags, then the kernel's own
// supports().
template <class P>
std::string why_not(const KernelEntry& e, const P& p) {
  const Half<P> h = half(e, p);
  if (p.dropout.enabled() && !h.takes_dropout)
    return "dropout_p > 0 is not supported (dropout_p = " + std::to_string(p.dropout.p) + ")";
  return h.supports ? h.supports(p) : std::string();
}

// CPU kernels take host tensors, every other arch device tensors.
bool reaches(const KernelEntry& e, Device device) {
  return (e.info.arch == "cpu") == (device == Device::kCPU);
}

template <class P>
Status choose_named(std::string_view name, const P& p, const KernelEntry** chosen) {
  const auto entries = registry();
  for (const KernelEntry& e : entries) {
    if (e.info.name != name) continue;
    if (!half(e, p).run)
      return {StatusCode::kUnsupported,
              "kernel '" + std::string(name) + "' has no " + pass_name(p) + " pass"};
    std::string why = why_not(e, p);
    if (!why.empty())
      return {StatusCode::kUnsupported,
              "kernel '" + std::string(name) + "' does not support this call: " + why};
    *chosen = &e;
    return {};
  }
  std::string known;
  for (const KernelEntry& e : entries) known += (known.empty() ? "" : ", ") + std::string(e.info.name);
  return {StatusCode::kNotFound,
          "kernel '" + std::string(name) + "' is not in this build; known kernels: " + known};
}

// The entries "auto" may choose, highest auto_priority first (ties in list order), so that
// the first one that supports a call is the one chosen and no kernel below it is asked.
const std::vector<const KernelEntry*>& auto_order() {
  static const std::vector<const KernelEntry*> order = [] {
    std::vector<const KernelEntry*> v;
    for (const KernelEntry& e : registry())
      if (e.auto_priority > 0) v.push_back(&e);
    std::stable_sort(v.begin(), v.end(), [](const KernelEntry* a, const KernelEntry* b) {
      return a->auto_priority > b->auto_priority;
    });
    return v;
  }();
  return order;
}

template <class P>
Status choose(std::string_view name, const P& p, const KernelEntry** chosen) {
  if (name != kAutoKernel) return choose_named(name, p, chosen);
  for (const KernelEntry* e : auto_order()) {
    const Half<P> h = half(*e, p);
    if (!h.run || !reaches(*e, p.device)) continue;
    if (p.dropout.enabled() && !h.takes_dropout) continue;
    if (h.supports && !h.supports(p).empty()) continue;
    *chosen = e;
    return {};
  }
  std::string reasons;
  for (const KernelEntry& e : registry())
    if (e.auto_priority > 0 && half(e, p).run)
      reasons += "\n  " + std::string(e.info.name) + ": " + why_not(e, p);
  return {StatusCode::kUnsupported,
          std::string("no kernel supports this ") + pass_name(p) + " call:" + reasons};
}

// The empty-problem rule, in this one place (kernels have no early returns of their own).
// The forward has nothing to write without query rows; the backward still owes dk = dv = 0
// for keys that no query sees, so it runs whenever there are keys or queries.
bool nothing_to_write(const FwdParams& p) { return p.batch == 0 || p.total_q == 0 || p.seqlen_q == 0; }
bool nothing_to_write(const BwdParams& p) { return p.batch == 0 || (p.total_q == 0 && p.total_k == 0); }
// The KV-cache forward still appends its new rows when there are no query rows.
bool nothing_to_write(const KvCacheParams& p) {
  return p.batch == 0 || ((p.seqlen_q == 0 || p.heads_q == 0) && p.seqlen_new == 0);
}

template <class P>
Status run_checked(const P& p, std::string_view name) {
  const KernelEntry* e = nullptr;
  FL_CHECK(choose(name, p, &e));
  const Half<P> h = half(*e, p);
  const size_t need = h.workspace ? h.workspace(p) : 0;
  if (p.workspace_bytes < need)
    return {StatusCode::kWorkspaceTooSmall,
            "workspace_bytes (" + std::to_string(p.workspace_bytes) + ") is smaller than workspace_size() = " +
                std::to_string(need) + " for kernel '" + std::string(e->info.name) + "'"};
  if (need > 0 && p.workspace == nullptr)
    return invalid("workspace is null but kernel '" + std::string(e->info.name) + "' needs " +
                   std::to_string(need) + " bytes");
  if (need > 0 && reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)
    return invalid("workspace must be 16-byte aligned (kernel '" + std::string(e->info.name) +
                   "' reads and writes it 16 bytes at a time)");
  if (nothing_to_write(p)) return {};
  return h.run(p);
}

template <class P>
Status size_checked(const P& p, std::string_view name, size_t* bytes) {
  if (!bytes) return invalid("bytes (the output pointer of workspace_size) is null");
  const KernelEntry* e = nullptr;
  FL_CHECK(choose(name, p, &e));
  const Half<P> h = half(*e, p);
  *bytes = h.workspace ? h.workspace(p) : 0;
  return {};
}

template <class P>
Status name_checked(const P& p, std::string_view name, std::string* out) {
  if (!out) return invalid("name (the output pointer of select_kernel) is null");
  const KernelEntry* e = nullptr;
  FL_CHECK(choose(name, p, &e));
  out->assign(e->info.name);  // reuses the caller's capacity
  return {};
}

// Params from Args, then `then(params)`.
template <class P, class Args, class F>
Status validated(const Args& a, F&& then) {
  P p;
  FL_CHECK(api::make_params(a, &p));
  return then(p);
}

}  // namespace

namespace api {
Status run_kvcache(const KvCacheParams& p, std::string_view kernel) { return run_checked(p, kernel); }
Status kvcache_workspace(const KvCacheParams& p, std::string_view kernel, size_t* bytes) {
  return size_checked(p, kernel, bytes);
}
}  // namespace api

Status forward(const ForwardArgs& a) noexcept {
  return validated<FwdParams>(a, [&](const FwdParams& p) { return run_checked(p, a.kernel); });
}

Status backward(const BackwardArgs& a) noexcept {
  return validated<BwdParams>(a, [&](const BwdParams& p) { return run_checked(p, a.kernel); });
}

Status workspace_size(const ForwardArgs& a, size_t* bytes) noexcept {
  return validated<FwdParams>(a, [&](const FwdParams& p) { return size_checked(p, a.kernel, bytes); });
}

Status workspace_size(const BackwardArgs& a, size_t* bytes) noexcept {
  return validated<BwdParams>(a, [&](const BwdParams& p) { return size_checked(p, a.kernel, bytes); });
}

Status select_kernel(const ForwardArgs& a, std::string* name) noexcept {
  return validated<FwdParams>(a, [&](const FwdParams& p) { return name_checked(p, a.kernel, name); });
}

Status select_kernel(const BackwardArgs& a, std::string* name) noexcept {
  return validated<BwdParams>(a, [&](const BwdParams& p) { return name_checked(p, a.kernel, name); });
}

}  // namespace flashlab
