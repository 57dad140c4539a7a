# Third-party dependencies: Debian 12 packages installed by scripts/setup.sh,
# and PyTorch's LibTorch 2.11 or newer (docs/architecture.md, "LibTorch").

# LibTorch. An explicit Torch_DIR or CMAKE_PREFIX_PATH wins; without one,
# Torch comes from the torch package of TANDEM_PYTHON: by default the
# project's virtual environment (.venv/, made by scripts/setup.sh), else the
# python3 on PATH.
set(TANDEM_TORCH_MIN_VERSION 2.11)
set(TANDEM_TORCH_TESTED_VERSIONS
    "2.11 (CUDA: the GPU kit), 2.13 (CPU, full suite) and 2.14 (CUDA, compile and link)")
if(NOT Torch_DIR AND NOT CMAKE_PREFIX_PATH AND NOT DEFINED ENV{Torch_DIR}
   AND NOT DEFINED ENV{CMAKE_PREFIX_PATH})
  if(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(tandem_default_python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  else()
    find_program(tandem_default_python NAMES python3 python)
  endif()
  set(TANDEM_PYTHON "${tandem_default_python}" CACHE FILEPATH
      "Python whose torch package provides LibTorch (when no Torch_DIR or CMAKE_PREFIX_PATH is given)")
  execute_process(
    COMMAND "${TANDEM_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE tandem_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_VARIABLE tandem_torch_error RESULT_VARIABLE tandem_torch_rc)
  if(NOT tandem_torch_rc EQUAL 0)
    message(FATAL_ERROR
      "tandem: no LibTorch. '${TANDEM_PYTHON}' cannot import torch:\n${tandem_torch_error}\n"
      "Run scripts/setup.sh (it installs torch==2.13.0 into .venv/), point -DTANDEM_PYTHON at "
      "a Python with torch ${TANDEM_TORCH_MIN_VERSION} or newer, or pass "
      "-DCMAKE_PREFIX_PATH=<libtorch>.")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${tandem_torch_prefix}")
endif()

# The Python the tests and benchmarks run as PyTorch's peer (reference
# results, safetensors read back): the one Torch came from, else .venv's.
if(TANDEM_PYTHON)
  set(TANDEM_PEER_PYTHON "${TANDEM_PYTHON}")
elseif(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  set(TANDEM_PEER_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python")
else()
  find_program(TANDEM_PEER_PYTHON NAMES python3 python)
endif()

find_package(Torch REQUIRED)
if(Torch_VERSION VERSION_LESS TANDEM_TORCH_MIN_VERSION)
  message(FATAL_ERROR
    "tandem: LibTorch ${Torch_VERSION} at ${Torch_DIR} is too old. tandem needs "
    "${TANDEM_TORCH_MIN_VERSION} or newer (tested: ${TANDEM_TORCH_TESTED_VERSIONS}). Install a "
    "newer one (scripts/setup.sh puts torch==2.13.0 into .venv/) or point CMAKE_PREFIX_PATH at it.")
endif()
if(Torch_VERSION VERSION_GREATER_EQUAL 2.15)
  message(WARNING "tandem: LibTorch ${Torch_VERSION} is newer than any CI builds "
                  "(${TANDEM_TORCH_TESTED_VERSIONS}); expect compile errors in src/core/torch_compat.h")
endif()

# LibTorch 2.14's headers need C++20 (ATen/ATen.h stops with "#error C++20 or
# later compatible compiler is required"); 2.13's need C++17. tandem builds
# with whichever its LibTorch asks for, and passes it on to consumers.
file(STRINGS "${TORCH_INSTALL_PREFIX}/include/ATen/ATen.h" tandem_aten_cxx20 REGEX "C\\+\\+20")
if(tandem_aten_cxx20)
  set(CMAKE_CXX_STANDARD 20)
endif()

find_package(Threads REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
# CLI11's file validators call std::filesystem::status, which LibTorch 2.11's
# CUDA libtorch.so exports a copy of (docs/architecture.md, "LibTorch
# versions"): every program parsing flags with CLI11 uses its stat() path.
set_property(TARGET CLI11::CLI11 APPEND PROPERTY INTERFACE_COMPILE_DEFINITIONS
             CLI11_HAS_FILESYSTEM=0)

# fmt: LibTorch puts its own fmt (12.x) on the include path ahead of any
# system one, so tandem uses exactly that copy, header-only. Linking Debian's
# libfmt (9.x) against fmt 12 headers would mix two versions.
# (The torch-free fuzz targets in fuzz/ use Debian's libfmt-dev instead.)
set(TANDEM_FMT_DEFINES FMT_HEADER_ONLY=1)

# c10d's ProcessGroupGloo.hpp includes <gloo/...> headers, which PyTorch's
# packages do not ship. They come from Debian's libgloo-dev; tandem touches
# Gloo only through c10d and opaque shared_ptrs (docs/architecture.md, "Gloo
# headers", and the GlooHeaders ctest check this).
find_path(TANDEM_GLOO_INCLUDE_DIR gloo/rendezvous/store.h)
if(NOT TANDEM_GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "tandem: no <gloo/rendezvous/store.h>. c10d's Gloo header needs Gloo's "
                      "headers: install libgloo-dev (scripts/setup.sh does).")
endif()
set(TANDEM_TORCH_DEFINES USE_C10D_GLOO)

# CUDA build of LibTorch: NCCL through ProcessGroupNCCL.
set(TANDEM_TORCH_CUDA OFF)
set(TANDEM_WITH_NCCL OFF)
set(TANDEM_CUDA_PIP_INCLUDE_DIRS)
if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda)
  set(TANDEM_TORCH_CUDA ON)
  list(APPEND TANDEM_TORCH_DEFINES TANDEM_WITH_CUDA=1)
  # pip's torch comes with nvidia-* packages beside it that hold the headers
  # of exactly the CUDA libraries it was built with (cuSPARSE, cuBLAS, NCCL,
  # ...), which LibTorch's headers include and a minimal toolkit may lack.
  # They go onto the torch target, so they reach whatever links it
  # (tandemConfig.cmake does the same for installed consumers).
  file(GLOB TANDEM_CUDA_PIP_INCLUDE_DIRS LIST_DIRECTORIES true
       "${TORCH_INSTALL_PREFIX}/../nvidia/*/include")
  if(TANDEM_CUDA_PIP_INCLUDE_DIRS)
    set_property(TARGET torch APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES
                 ${TANDEM_CUDA_PIP_INCLUDE_DIRS})
  endif()
  find_path(TANDEM_NCCL_PG_HEADER torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp
            PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(TANDEM_NCCL_PG_HEADER)
    set(TANDEM_WITH_NCCL ON)
    list(APPEND TANDEM_TORCH_DEFINES USE_C10D_NCCL TANDEM_WITH_NCCL=1)
  endif()
endif()

# The C++ ABI LibTorch was built with (the pip packages use the new one; a
# mismatch fails at link time with undefined std::__cxx11 symbols).
set(TANDEM_TORCH_CXX11_ABI 1)
if("${TORCH_CXX_FLAGS}" MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  set(TANDEM_TORCH_CXX11_ABI 0)
endif()
if(CUDA_VERSION)
  set(tandem_cuda_text "CUDA ${CUDA_VERSION}")
elseif(CUDAToolkit_VERSION)
  set(tandem_cuda_text "CUDA ${CUDAToolkit_VERSION}")
elseif(TANDEM_TORCH_CUDA)
  set(tandem_cuda_text "CUDA")
else()
  set(tandem_cuda_text "CPU only")
endif()
message(STATUS "tandem: LibTorch ${Torch_VERSION} (${tandem_cuda_text}, C++ ABI "
               "_GLIBCXX_USE_CXX11_ABI=${TANDEM_TORCH_CXX11_ABI}, C++${CMAKE_CXX_STANDARD}) from ${Torch_DIR}; "
               "NCCL backend: ${TANDEM_WITH_NCCL}; Gloo headers: ${TANDEM_GLOO_INCLUDE_DIR}")

# Where LibTorch's shared libraries live: installed programs carry it in their
# RUNPATH (cmake/TandemInstall.cmake).
get_filename_component(TANDEM_TORCH_LIBDIR "${TORCH_LIBRARY}" DIRECTORY)

# Built inside another project (add_subdirectory): imported targets are
# visible only in the directory that found them, and the consumer links
# tandem::tandem, whose interface names torch, Threads::Threads and
# nlohmann_json. Make them visible project-wide.
if(NOT TANDEM_TOP_LEVEL)
  get_directory_property(tandem_imported IMPORTED_TARGETS)
  foreach(target IN LISTS tandem_imported)
    get_target_property(tandem_is_global ${target} IMPORTED_GLOBAL)
    if(NOT tandem_is_global)
      set_target_properties(${target} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()
