# Sourced by the GPU-machine scripts: the output folder ($OUT from the device tool, else
# gpu-out/) and NVRTC with the CUDA headers of the machine's toolkit.
out="${OUT:-gpu-out}"
mkdir -p "$out"
cuda="${CUDA_HOME:-/usr/local/cuda}"
export TESSERA_CUDA_INCLUDE="${TESSERA_CUDA_INCLUDE:-$cuda/include}"
export LD_LIBRARY_PATH="$cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TESSERA_CUDA_CACHE="${TMPDIR:-/tmp}/tessera-cubin-cache"
