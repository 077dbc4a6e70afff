# Warning flags for every target of the project (moeinfer_warnings interface target).
add_library(moeinfer_warnings INTERFACE)
target_compile_options(moeinfer_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:C,CXX>:-Wall -Wextra -Wno-unused-parameter>
  $<$<AND:$<COMPILE_LANGUAGE:C,CXX>,$<BOOL:${MOEINFER_WERROR}>>:-Werror>)
if(MOEINFER_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
if(MOEINFER_NATIVE)
  add_compile_options(-march=native)
endif()
