# Warning flags for every target of the project (moeinfer_warnings interface target).
add_library(moeinfer_warnings INTERFACE)
target_compile_options(moeinfer_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:C,CXX>:-Wall -Wextra -Wno-unused-parameter>
  $<$<AND:$<COMPILE_LANGUAGE:C,CXX>,$<BOOL:${MOEINFER_WERROR}>>:-Werror>)
# GCC 12's flow-based diagnostics report std::vector copies inlined at -O3 as null/overflowing
# memmoves (known false positives); they stay visible as warnings but do not fail CI.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  target_compile_options(moeinfer_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wno-error=nonnull -Wno-error=stringop-overflow -Wno-error=array-bounds -Wno-error=stringop-overread>)
endif()
if(MOEINFER_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
if(MOEINFER_NATIVE)
  add_compile_options(-march=native)
endif()
