// A job whose process begins to exit slowly, for the supervisor's tests (test_supervisor.cpp):
// it writes one heartbeat (rank 0 of 1, phase "step", step 3), then its main thread ends while a
// second thread sleeps SECONDS and ends the process with status 3. In between, the process beats
// no more and cannot be reaped yet, like a rank killed while one of its threads finishes an
// fsync. Usage: exiting_job SECONDS (the heartbeat directory comes from $ZAYA_HEARTBEAT_DIR).
#include <pthread.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "supervise/heartbeat.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SECONDS\n", argv[0]);
    return 2;
  }
  const double seconds = std::atof(argv[1]);
  const char* dir = std::getenv(zaya::kHeartbeatDirEnv);
  zaya::HeartbeatWriter(dir ? dir : "", 0, 1).beat("step", 3, 9);
  std::thread finisher([seconds] {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    std::_Exit(3);
  });
  finisher.detach();
  pthread_exit(nullptr);
}
