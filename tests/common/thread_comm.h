// Point-to-point messages between threads of one process: each thread is one rank of a
// ThreadCommGroup. Enough for code that only sends and receives (context parallelism), so a
// unit test can run every rank of a group in-process. Collectives are not provided (they fail).
#pragma once
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "dist/comm.h"

namespace zaya::test {

class ThreadCommGroup {
 public:
  explicit ThreadCommGroup(int size) : size_(size) {}
  int size() const { return size_; }
  // Queues a copy of the message (sends never block).
  void post(int src, int dst, int tag, const void* data, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& q = boxes_[{src, dst, tag}];
    q.emplace_back(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    cv_.notify_all();
  }
  // Blocks until the next message from src to dst with tag arrives; its size must be `bytes`.
  void take(int src, int dst, int tag, void* data, int64_t bytes) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& q = boxes_[{src, dst, tag}];
    cv_.wait(lock, [&] { return !q.empty(); });
    if (int64_t(q.front().size()) != bytes)
      throw std::runtime_error("thread comm: message of " + std::to_string(q.front().size()) + " bytes, expected " +
                               std::to_string(bytes));
    std::memcpy(data, q.front().data(), size_t(bytes));
    q.pop_front();
  }

 private:
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> boxes_;
};

class ThreadComm : public Comm {
 public:
  ThreadComm(ThreadCommGroup& group, int rank) : group_(group), rank_(rank) {}
  std::string name() const override { return "thread"; }
  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }
  CommHandle send(const void* buf, int64_t count, CommType type, int peer, int tag) override {
    group_.post(rank_, peer, tag, buf, count * comm_type_size(type));
    ++sends;
    return std::make_unique<Done>(nullptr);
  }
  CommHandle recv(void* buf, int64_t count, CommType type, int peer, int tag) override {
    // Matched when waited on: messages queue in order per (source, tag).
    return std::make_unique<Done>([this, buf, count, type, peer, tag] {
      group_.take(peer, rank_, tag, buf, count * comm_type_size(type));
    });
  }
  CommHandle all_reduce(const void*, void*, int64_t, CommType, ReduceOp) override { return unsupported(); }
  CommHandle reduce_scatter(const void*, void*, const std::vector<int64_t>&, CommType, ReduceOp) override {
    return unsupported();
  }
  CommHandle all_gather(const void*, void*, const std::vector<int64_t>&, CommType) override { return unsupported(); }
  CommHandle broadcast(void*, int64_t, CommType, int) override { return unsupported(); }
  CommHandle barrier() override { return unsupported(); }
  int64_t sends = 0;

 private:
  struct Done : CommRequest {
    explicit Done(std::function<void()> f) : on_wait(std::move(f)) {}
    void wait() override {
      if (on_wait) on_wait();
      on_wait = nullptr;
    }
    bool test() override {
      wait();
      return true;
    }
    std::function<void()> on_wait;
  };
  static CommHandle unsupported() { throw std::logic_error("thread comm: collectives are not provided"); }
  ThreadCommGroup& group_;
  int rank_;
};

}  // namespace zaya::test
