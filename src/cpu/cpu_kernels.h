// Registry entries of the CPU backend.
#pragma once

#include "common/registry.h"

namespace flashlab {

KernelEntry cpu_reference_entry();  // src/cpu/reference.cpp
KernelEntry cpu_flash_entry();      // src/cpu/flash.cpp

}  // namespace flashlab
