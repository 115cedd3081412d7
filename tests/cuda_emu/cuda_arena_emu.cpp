// daemon/cuda_arena.cpp compiled against the CUDA emulation: the cuda arena in a daemon
// (expertd_emu) whose "device" memory is shared memory, so engine processes open it through CUDA
// IPC as on a GPU.
#include "daemon/cuda_arena.cpp"
