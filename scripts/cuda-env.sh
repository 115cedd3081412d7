# Sourced by the build scripts: finds nvcc where the CUDA toolkit installs it when it is not on
# PATH, so EXPERTD_CUDA=AUTO (the default) builds the CUDA tier wherever the toolkit is present.
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    if [ -x "$d/nvcc" ]; then export CUDACXX="$d/nvcc"; break; fi
  done
fi
