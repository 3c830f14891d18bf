# How CTest schedules the tests that start several processes: mpirun's ranks (tests/mpi, tests/dp,
# the emulated and real NCCL checks) or a supervisor and its jobs (tests/supervise).
#
# On CI's 2 cores, two of them side by side put 4 to 6 busy processes on 2 cores: under the
# sanitizers cp_equivalence took 168 s next to dp_equivalence instead of 78 s alone, and
# mpi_comm_check_np3 35 s instead of 1 s. And in declaration order (what CTest uses on a fresh
# clone, with no costs measured yet) they all come last, after the unit tests, so they ran side
# by side at the end of the run with nothing else left to fill the other core.
# zaya_multi_process_tests(<test>...) gives them one lock, so that at most one runs at a time, and
# a cost above every measured one, so that their chain starts first while the single-process
# tests take the other core.
function(zaya_multi_process_tests)
  if(ARGN)
    set_tests_properties(${ARGN} PROPERTIES RESOURCE_LOCK zaya_multi_process COST 10000)
  endif()
endfunction()

# Every test defined so far in the calling directory.
function(zaya_multi_process_tests_of_this_directory)
  get_directory_property(tests TESTS)
  zaya_multi_process_tests(${tests})
endfunction()
