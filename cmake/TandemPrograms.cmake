# Programs built on libtandem (tests, examples, benchmarks, workers): the
# warnings, the optimisation level, and one precompiled <torch/torch.h>.
#
# Parsing <torch/torch.h> costs about 12 s per translation unit on the 2-core
# CI machine; the precompiled header loads in about 4. It is built once, in
# tandem_torch_pch, with the compile flags every program gets from linking
# tandem::tandem and from TANDEM_PROGRAM_COMPILE_OPTIONS, and reused
# (REUSE_FROM) by each program. GCC checks that the flags match and says so
# with -Winvalid-pch when they do not.
#
# Release builds compile these programs at -O1 (about a quarter faster to
# compile than -O2): their own code only drives libtandem and LibTorch, which
# are built at -O2 (tandem's kernels at -O3). docs/performance.md has the
# benchmark figures taken on this build.

set(TANDEM_PROGRAM_COMPILE_OPTIONS $<$<CONFIG:Release>:-O1>)

# Only when this build makes programs: inside another project (add_subdirectory)
# tests, examples and benchmarks are off and nothing would use it.
set(TANDEM_USE_PCH OFF)
if(TANDEM_PCH AND (TANDEM_BUILD_TESTS OR TANDEM_BUILD_EXAMPLES OR TANDEM_BUILD_BENCH))
  set(TANDEM_USE_PCH ON)
endif()
if(TANDEM_USE_PCH)
  add_library(tandem_torch_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/torch_pch.cpp)
  target_link_libraries(tandem_torch_pch PRIVATE tandem::tandem)
  target_compile_options(tandem_torch_pch PRIVATE ${TANDEM_PROGRAM_COMPILE_OPTIONS})
  target_precompile_headers(tandem_torch_pch PRIVATE <torch/torch.h>)
endif()

# tandem_program(<target>): the settings every program built on tandem gets.
function(tandem_program target)
  target_link_libraries(${target} PRIVATE tandem::tandem)
  target_compile_options(${target} PRIVATE ${TANDEM_WARNINGS} ${TANDEM_PROGRAM_COMPILE_OPTIONS})
  if(TANDEM_USE_PCH)
    target_precompile_headers(${target} REUSE_FROM tandem_torch_pch)
  endif()
endfunction()
