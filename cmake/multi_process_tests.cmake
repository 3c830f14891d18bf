# How CTest schedules the tests that start several processes: mpirun's ranks (tests/mpi, tests/dp,
# the emulated and real NCCL checks) or a supervisor and its jobs (tests/supervise).
#
# On a fresh clone CTest runs the tests in the order they are declared, and these came last: they
# ran side by side at the end of the run, up to 6 busy processes on CI's 2 cores, with nothing
# else left for the other core. zaya_multi_process_tests(<test>...) gives them one lock, so at
# most one runs at a time, and a cost above any measured one, so their chain starts first while
# the single-process tests take the other core.
# Measured under the sanitizers with no costs recorded yet (as on a fresh clone, with
# OMP_WAIT_POLICY=PASSIVE as in CI): the test phase took 1,048 s, against 1,063 s without the
# lock. The gain is small because a 2-rank test is about as slow next to a single-process test as
# next to another mpirun (cp_equivalence 167 s against 168 s). What the lock does buy is that no
# two of them ever share the 2 cores, so their watchdog and heartbeat timeouts have that margin.
#
# Under the sanitizers these tests also run with HWLOC_COMPONENTS=-pci. When the ranks outnumber
# the cores, mpirun does not bind them and every rank loads the machine's topology itself in
# MPI_Init; hwloc's PCI scan grows its buffers one realloc at a time, which ASan's realloc turns
# into a copy each time. Measured under ASan: a 3-rank comm_check took 13.8 s with the scan and
# 1.3 s without it (2 ranks: 0.9 s either way); in the release build the two are the same
# (0.8 s), so the release tests keep the default topology, as users run it.
function(zaya_multi_process_tests)
  if(ARGN)
    set_tests_properties(${ARGN} PROPERTIES RESOURCE_LOCK zaya_multi_process COST 10000)
    if(ZAYA_SANITIZE)
      set_property(TEST ${ARGN} APPEND PROPERTY ENVIRONMENT HWLOC_COMPONENTS=-pci)
    endif()
  endif()
endfunction()

# Every test defined so far in the calling directory.
function(zaya_multi_process_tests_of_this_directory)
  get_directory_property(tests TESTS)
  zaya_multi_process_tests(${tests})
endfunction()
