# Configure + build the clang fuzz project (tests/fuzz as top level), then fuzz for a bounded
# number of runs. Usage: cmake -DCXX=clang++ -DSRC=tests/fuzz -DBIN=out -DRUNS=20000 -DSEED=1 -P run_fuzz.cmake
if("${SEED}" STREQUAL "")
  set(SEED 1)  # "-seed=" alone would stop libFuzzer; 0 (a random seed) must be asked for explicitly
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SRC} -B ${BIN} -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=RelWithDebInfo
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "fuzz: configure failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BIN} -j2 --target fuzz-tokenizer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "fuzz: build failed (${rc})")
endif()
# Seed corpus: the committed inputs (first byte selects vocabulary/mode), including every
# reproducer a run once found, so each run replays them before mutating. A fresh copy each run.
file(REMOVE_RECURSE ${BIN}/corpus)
file(COPY ${SRC}/corpus DESTINATION ${BIN})
execute_process(COMMAND ${BIN}/fuzz-tokenizer -runs=${RUNS} -seed=${SEED} -max_len=4096 -timeout=30 -rss_limit_mb=4096
                        -artifact_prefix=${BIN}/ ${BIN}/corpus
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "fuzz: fuzz-tokenizer found a problem (exit ${rc}); reproducer in ${BIN}/")
endif()
