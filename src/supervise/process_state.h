// What /proc tells the supervisor about a rank's process on this host (Linux).
#pragma once
#include <cstdint>

namespace zaya {

// Whether process `pid` has begun to exit but is not gone yet: its main thread has ended (a
// zombie leader while other threads finish), or a SIGKILL is pending for one of its threads (a
// thread in an uninterruptible wait, such as fsync, acts on it only when the wait ends). Such a
// process beats no more, yet it is not hung: its exit status will soon tell what happened.
// False for a process that runs normally, one that is stopped, or one that does not exist.
bool process_is_exiting(int64_t pid);

}  // namespace zaya
