// Empty: the emulation build converts halves on the host (kernels/fp16.h).
#pragma once
