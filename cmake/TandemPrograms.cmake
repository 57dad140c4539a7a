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

# Programs (examples, benchmarks, the CLI) load the library's own
# precompiled <torch/torch.h> (src/CMakeLists.txt): they compile at the
# library's -O1, with its macros (all public), and, with a shared library,
# with its -fPIC (GCC refuses a header precompiled with other code-generation
# options; Debian's GCC would otherwise build programs as PIE). That saves
# building a second one (about 72 s of CPU on the slowest machine). Tests and
# their workers, at -O0, load tandem_test_pch, built once by a target of its
# own (it compiles one empty file besides, about 9 s of CPU). A real test
# program as owner would start late: Ninja 1.11 starts ready jobs in the
# order of build.ninja, where tests/ comes last, and every test waited for it
# while a core stood idle for 80 s. Defined here, at the top, it starts with
# the library's.
if(TANDEM_SHARED)
  list(APPEND TANDEM_PROGRAM_COMPILE_OPTIONS -fPIC)
endif()
# tandem_program_pch(<pch target> <options>): the precompiled <torch/torch.h>
# for programs compiled with <options>.
function(tandem_program_pch pch_target options)
  add_library(${pch_target} OBJECT ${PROJECT_SOURCE_DIR}/cmake/torch_pch.cpp)
  target_link_libraries(${pch_target} PRIVATE tandem::tandem)
  target_compile_options(${pch_target} PRIVATE ${options})
  target_precompile_headers(${pch_target} PRIVATE <torch/torch.h>)
endfunction()
if(TANDEM_USE_PCH AND TANDEM_BUILD_TESTS)
  tandem_program_pch(tandem_test_pch "${TANDEM_TEST_COMPILE_OPTIONS}")
endif()

# tandem_program_at(<target> <options> <pch target>): links tandem, adds the
# warnings and <options>, and reuses the precompiled header <pch target> built.
function(tandem_program_at target options pch_target)
  target_link_libraries(${target} PRIVATE tandem::tandem)
  target_compile_options(${target} PRIVATE ${TANDEM_WARNINGS} ${options})
  if(TANDEM_USE_PCH)
    target_precompile_headers(${target} REUSE_FROM ${pch_target})
    # A header GCC refuses would cost the ~30 s of parsing it saves, silently.
    target_compile_options(${target} PRIVATE -Werror=invalid-pch)
  endif()
endfunction()

# tandem_program(<target>): an example or benchmark built on tandem.
function(tandem_program target)
  tandem_program_at(${target} "${TANDEM_PROGRAM_COMPILE_OPTIONS}" tandem)
endfunction()

# tandem_test_program(<target>): a test binary or a worker program tests
# drive, at the tests' optimisation level.
function(tandem_test_program target)
  tandem_program_at(${target} "${TANDEM_TEST_COMPILE_OPTIONS}" tandem_test_pch)
endfunction()
