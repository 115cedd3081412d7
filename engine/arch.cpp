#include "engine/arch.h"

namespace engine {

#define X(id, name) std::unique_ptr<Arch> make_arch_##id();
#include "engine/archs/list.h"
#undef X

std::unique_ptr<Arch> make_arch(const std::string& name) {
#define X(id, arch_name) \
  if (name == arch_name) return make_arch_##id();
#include "engine/archs/list.h"
#undef X
  return nullptr;
}

std::vector<std::string> arch_names() {
  std::vector<std::string> v;
#define X(id, arch_name) v.push_back(arch_name);
#include "engine/archs/list.h"
#undef X
  return v;
}

std::string supported_archs() {
  std::string s;
#define X(id, arch_name) s += s.empty() ? arch_name : ", " arch_name;
#include "engine/archs/list.h"
#undef X
  return s;
}

}  // namespace engine
