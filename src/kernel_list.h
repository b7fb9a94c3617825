// Every kernel of the registry, one line each, in the order `flashlab list` prints them and
// the benchmark's --ladder compares them: the CPU backends, the CUDA ladder in order, then
// the production kernels. Adding a kernel is its own source files (CMake picks up every
// .cpp/.cu in its backend's folder) and one line here.
//
// FL_KERNEL(ns, f) names a function `KernelEntry flashlab::ns::f()` defined next to the
// kernel, in its backend's namespace. The file is read three times by src/registry.cpp: to
// declare the functions, to count them and to build the table. No include guard, on purpose.

FL_KERNEL(cpu, reference_entry)  // src/cpu/reference.cpp
FL_KERNEL(cpu, flash_entry)      // src/cpu/flash.cpp

#if FLASHLAB_WITH_CUDA
FL_KERNEL(cuda, naive_entry)         // src/cuda/ladder/01_naive.cu
FL_KERNEL(cuda, fa1_entry)           // src/cuda/ladder/02_fa1.cu
FL_KERNEL(cuda, fa2_simt_entry)      // src/cuda/ladder/03_fa2_simt.cu
FL_KERNEL(cuda, fa2_mma_entry)       // src/cuda/ladder/04_fa2_mma.cu
FL_KERNEL(cuda, fa2_simt_bwd_entry)  // src/cuda/ladder/05_fa2_simt_bwd.cu
FL_KERNEL(sm80, cute_fa2_entry)      // src/cuda/sm80/dispatch.cu
#if FLASHLAB_WITH_SM90
FL_KERNEL(sm90, cute_fa3_entry)  // src/cuda/sm90/fwd_dispatch.cu (sm_90a builds only)
#if FLASHLAB_ABLATIONS
// cute_fa3 with one technique of its schedule turned off (src/cuda/sm90/ablations.cu).
FL_KERNEL(sm90, cute_fa3_no_pingpong_entry)
FL_KERNEL(sm90, cute_fa3_no_overlap_entry)
FL_KERNEL(sm90, cute_fa3_serial_entry)
FL_KERNEL(sm90, cute_fa3_persistent_entry)
#endif
#endif
#endif
