# Configure + build the clang fuzz project (tests/fuzz as top level), then run a bounded
# session. Usage: cmake -DCXX=clang++ -DSRC=tests/fuzz -DBIN=out -DRUNS=20000 -P run_fuzz.cmake
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${BIN} -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=RelWithDebInfo
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "fuzz: configure failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BIN} -j2 --target fuzz-tokenizer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "fuzz: build failed (${rc})")
endif()
file(MAKE_DIRECTORY ${BIN}/corpus)
# Seed corpus: a few texts per mode (first byte selects vocabulary/mode).
file(WRITE ${BIN}/corpus/seed-text "\x00Hello world, it's 2024!\n\t<think>hi</think> \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80")
file(WRITE ${BIN}/corpus/seed-gpt4o "\x10HelloWORLD don't 1234567 /path\r\n")
file(WRITE ${BIN}/corpus/seed-recipe "\x03\x01abc\nmab c\n\x03<x>\nk\x01\x05\nhello abc")
execute_process(COMMAND ${BIN}/fuzz-tokenizer -runs=${RUNS} -max_len=4096 -timeout=30 -rss_limit_mb=4096
                        -artifact_prefix=${BIN}/ ${BIN}/corpus
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "fuzz: fuzz-tokenizer found a problem (exit ${rc}); reproducer in ${BIN}/")
endif()
