// The scalar reference build of the kernel bodies.
#define KERNELS_NS scalar
#include "kernels/impl.inc"
