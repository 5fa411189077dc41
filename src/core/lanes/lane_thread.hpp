// Starting a lane's thread (the devices' lanes and the host lanes alike).
#pragma once

#include <pthread.h>
#include <signal.h>

#include <thread>
#include <utility>

namespace gpupool::detail {

/// Starts a thread running `body` that never takes the process's asynchronous signals (Ctrl-C,
/// termination, timers): the kernel then hands them to the application's own threads, where a
/// Python main thread sees them at once. A thread inherits its creator's mask, so it is set
/// around the creation only. @throw std::system_error as std::thread does.
template <class Body>
std::thread start_lane_thread(Body&& body) {
  sigset_t asynchronous, previous;
  sigemptyset(&asynchronous);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGUSR1, SIGUSR2, SIGCHLD, SIGWINCH})
    sigaddset(&asynchronous, s);
  pthread_sigmask(SIG_BLOCK, &asynchronous, &previous);
  try {
    std::thread started(std::forward<Body>(body));
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    return started;
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
}

}  // namespace gpupool::detail
