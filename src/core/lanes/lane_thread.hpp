// Starting a lane's thread (the devices' lanes and the host lanes alike).
#pragma once

#include <pthread.h>
#include <signal.h>

#include <string>
#include <thread>
#include <utility>

namespace gpupool::detail {

/// Starts a thread running `body` that never takes the process's asynchronous signals (Ctrl-C,
/// termination, timers): the kernel then hands them to the application's own threads, where a
/// Python main thread sees them at once. A thread inherits its creator's mask, so it is set
/// around the creation only. The thread is named `name` (cut to the 15 characters Linux keeps), so
/// that `top -H`, debuggers and profilers tell the lanes apart. @throw std::system_error as
/// std::thread does.
template <class Body>
std::thread start_lane_thread(const std::string& name, Body&& body) {
  sigset_t asynchronous, previous;
  sigemptyset(&asynchronous);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2, SIGCHLD, SIGWINCH})
    sigaddset(&asynchronous, s);
  pthread_sigmask(SIG_BLOCK, &asynchronous, &previous);
  try {
    std::thread started(std::forward<Body>(body));
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    // A name is a help, not a need: a failure to set it is ignored.
    (void)pthread_setname_np(started.native_handle(), name.substr(0, 15).c_str());
    return started;
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
}

}  // namespace gpupool::detail
