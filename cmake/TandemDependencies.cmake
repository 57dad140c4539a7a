# Third-party dependencies. All come from Debian packages installed by
# scripts/setup.sh, or from a PyTorch 2.x LibTorch given via CMAKE_PREFIX_PATH.

find_package(Torch REQUIRED)
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(CLI11 CONFIG REQUIRED)

# c10d's Gloo headers are guarded by USE_C10D_GLOO and include <gloo/...>.
# Debian ships those headers in libgloo-dev; PyTorch wheels ship them inside
# the LibTorch include directory.
set(TANDEM_TORCH_DEFINES USE_C10D_GLOO)

# NCCL: a CUDA build of LibTorch that ships ProcessGroupNCCL.
set(TANDEM_WITH_NCCL OFF)
if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda)
  find_path(TANDEM_NCCL_PG_HEADER torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp
            PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(TANDEM_NCCL_PG_HEADER)
    set(TANDEM_WITH_NCCL ON)
    list(APPEND TANDEM_TORCH_DEFINES USE_C10D_NCCL TANDEM_WITH_NCCL=1)
  endif()
endif()

find_library(TANDEM_GLOO_LIBRARY NAMES gloo)
if(NOT TANDEM_GLOO_LIBRARY)
  # PyTorch wheels link Gloo statically into libtorch_cpu.
  set(TANDEM_GLOO_LIBRARY "")
endif()

message(STATUS "tandem: LibTorch ${Torch_VERSION}, NCCL backend: ${TANDEM_WITH_NCCL}")
