// A queue item that does nothing, for tests of the queue's order and of which items a lane's
// paths take: each test's item derives from it and adds what it is told apart by.
#pragma once

#include <exception>

#include "core/scheduling/work_item.hpp"

namespace gpupool::testing {

class inert_item : public detail::work_item {
 public:
  explicit inert_item(int priority_level = 0) { priority = priority_level; }
  bool claim() override { return true; }
  void start(detail::slot_context& /*slot*/) override {}
  void finish(detail::slot_context& /*slot*/) override {}
  void complete() noexcept override {}
  void fail(std::exception_ptr /*e*/) noexcept override {}
  bool cancel() noexcept override { return true; }
};

}  // namespace gpupool::testing
