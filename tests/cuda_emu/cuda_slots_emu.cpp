// client/cuda_slots.cpp compiled against the CUDA emulation: its IPC opens fail as unsupported.
#include "client/cuda_slots.cpp"
