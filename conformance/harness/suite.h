#pragma once
// A gtest fixture base that shares one worker process between the tests of a suite (a
// worker starts in milliseconds on stories260K, but 100 starts still add up). A worker
// that fails to start fails every test of the suite with its log; at the end the worker
// must stop on SIGTERM with exit code 0 (D13).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "harness/http_client.h"
#include "harness/test_env.h"
#include "harness/worker_process.h"
#include "harness/worker_stream.h"

namespace conformance {

template <class Derived>
class SharedWorkerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    try {
      proc_ = std::make_unique<WorkerProcess>(Derived::worker_options());
    } catch (const std::exception& e) {
      start_error_ = e.what();
    }
  }
  static void TearDownTestSuite() {
    if (proc_) {
      const int rc = proc_->stop();
      if (rc != 0)
        ADD_FAILURE() << "worker exit code after SIGTERM: " << rc << "\n" << proc_->log_text();
      proc_.reset();
    }
  }
  void SetUp() override {
    if (!proc_) FAIL() << "worker did not start: " << start_error_;
    if (!proc_->running()) FAIL() << "worker is not running any more; log:\n" << proc_->log_text();
  }
  static WorkerProcess& worker() { return *proc_; }
  static int port() { return proc_->port(); }

  static inline std::unique_ptr<WorkerProcess> proc_;
  static inline std::string start_error_;
};

}  // namespace conformance
