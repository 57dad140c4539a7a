# Programs built on libtandem (tests, examples, benchmarks, workers): the
# warnings, the optimisation level, and one precompiled <torch/torch.h>.
#
# Parsing <torch/torch.h> costs about 36 s of CPU per translation unit on the
# slowest 2-core machine (AVX2, no AVX-512); with the precompiled header 13 s
# are left. It is built once per optimisation level and reused (REUSE_FROM) by
# each program of that level. GCC refuses a header built at another level
# ("not used because `__OPTIMIZE__' not defined") and says so with
# -Winvalid-pch.
#
# Release builds compile examples and benchmarks at -O1 (about a quarter
# faster to compile than -O2): their own code only drives libtandem and
# LibTorch. libtandem is built at -O1 too, its kernels at -O3.
# docs/performance.md has the benchmark figures taken on this build.
#
# Tests and the worker programs they drive compile at -O0: at -O1 code
# generation took more than half of a test batch's compile (48 s of CPU of
# which 23 s were parsing, docs/development.md), and what they run is
# libtandem's and LibTorch's code, not their own.

set(TANDEM_PROGRAM_COMPILE_OPTIONS $<$<CONFIG:Release>:-O1>)
set(TANDEM_TEST_COMPILE_OPTIONS $<$<CONFIG:Release>:-O0>)

# Only when this build makes programs: inside another project (add_subdirectory)
# tests, examples and benchmarks are off and nothing would use it.
set(TANDEM_USE_PCH OFF)
if(TANDEM_PCH AND (TANDEM_BUILD_TESTS OR TANDEM_BUILD_EXAMPLES OR TANDEM_BUILD_BENCH))
  set(TANDEM_USE_PCH ON)
endif()

# The precompiled <torch/torch.h> of each level is built once and reused by
# the other programs of that level. The tests' is built by the test workers
# (tests/CMakeLists.txt) alongside their own code: a translation unit compiled
# only to make the header costs about 13 s of CPU on the slowest machine, what
# loading this precompiled header takes (GCC instantiates the templates its
# inline functions use again in every translation unit). The examples',
# benchmarks' and CLI's has a target of its own, tandem_torch_pch: a header
# built by the CLI would carry CLI11's CLI11_HAS_FILESYSTEM, and GCC refuses it
# to every program compiled without that macro ("not used because
# `CLI11_HAS_FILESYSTEM' not defined").
set(TANDEM_PROGRAM_PCH_OWNER tandem_torch_pch)
set(TANDEM_TEST_PCH_OWNER tandem_test_workers)
if(TANDEM_USE_PCH)
  add_library(tandem_torch_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cpp)
  target_link_libraries(tandem_torch_pch PRIVATE tandem::tandem)
  target_compile_options(tandem_torch_pch PRIVATE ${TANDEM_PROGRAM_COMPILE_OPTIONS})
  target_precompile_headers(tandem_torch_pch PRIVATE <torch/torch.h>)
endif()

# tandem_program_at(<target> <options> <pch owner>): links tandem, adds the
# warnings and <options>, and builds the precompiled header (when <target> is
# <pch owner>) or reuses <pch owner>'s.
function(tandem_program_at target options pch_owner)
  target_link_libraries(${target} PRIVATE tandem::tandem)
  target_compile_options(${target} PRIVATE ${TANDEM_WARNINGS} ${options})
  if(NOT TANDEM_USE_PCH)
  elseif(target STREQUAL pch_owner)
    target_precompile_headers(${target} PRIVATE <torch/torch.h>)
  else()
    target_precompile_headers(${target} REUSE_FROM ${pch_owner})
    # A header GCC refuses would cost the ~30 s of parsing it saves, silently.
    target_compile_options(${target} PRIVATE -Werror=invalid-pch)
  endif()
endfunction()

# tandem_program(<target>): an example or benchmark built on tandem.
function(tandem_program target)
  tandem_program_at(${target} "${TANDEM_PROGRAM_COMPILE_OPTIONS}" ${TANDEM_PROGRAM_PCH_OWNER})
endfunction()

# tandem_test_program(<target>): a test binary or a worker program tests
# drive, at the tests' optimisation level.
function(tandem_test_program target)
  tandem_program_at(${target} "${TANDEM_TEST_COMPILE_OPTIONS}" ${TANDEM_TEST_PCH_OWNER})
endfunction()
