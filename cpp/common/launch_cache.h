// The bookkeeping behind launch_repeated (repeated_launch.h), free of CUDA so that a host-only
// test drives it (tests/cpp/test_launch_cache.cpp): for each call of one thread, whether it
// replays a graph, captures one or launches directly, and which graphs to destroy.
//
// Entries (a key seen, with or without a graph) sit in one table of kCapacity, found through a
// hash index and ordered by last use: a new key evicts the least recently used one, so a key
// used every step stays while fewer than kCapacity other keys come between its uses, and a
// cycle longer than that evicts each key before its next use and captures nothing.
// A key is captured once it has been seen `sights_needed()` times while resident. That number
// adapts to whether graphs pay for their capture: it doubles (up to kMaxSights) each time a
// graph is evicted before kPayoffReplays replays, and halves (down to kMinSights) each time a
// graph reaches them. A failed capture or replay launches directly and retries the capture
// after kRetryCalls calls of that key, doubling per failure up to kRetryCalls << kMaxBackoff.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cstring>

namespace snapmla {

constexpr size_t kMaxLaunchKeyBytes = 512;

class LaunchCache {
 public:
  // 512 entries hold a 61-layer step at 8 batch shapes (488 keys), about 280 KiB a thread.
  static constexpr int kCapacity = 512;
  // A capture and instantiation costs the host time of several direct calls (bench/
  // host_overhead_c.cu measures the ratio); 16 replays pay for one with room to spare.
  static constexpr uint32_t kPayoffReplays = 16;
  static constexpr uint32_t kMinSights = 2;
  static constexpr uint32_t kMaxSights = 64;
  static constexpr uint32_t kRetryCalls = 16;
  static constexpr int kMaxBackoff = 6;  // at most 1024 direct calls between two tries

  enum class Action { kDirect, kCapture, kReplay };
  struct Decision {
    Action action = Action::kDirect;
    int entry = -1;         // for captured / capture_failed / replay_failed
    void* graph = nullptr;  // kReplay: the graph to launch
  };
  // A graph evicted from the table, made in context `ctx`: the caller destroys it.
  struct Dropped {
    void* graph = nullptr;
    uint64_t ctx = 0;
  };

  LaunchCache() {
    std::memset(index_, 0xff, sizeof(index_));
    for (int i = 0; i < kCapacity; ++i) free_[i] = static_cast<int16_t>(kCapacity - 1 - i);
    num_free_ = kCapacity;
  }

  // What to do with a call of `key` (key_bytes <= kMaxLaunchKeyBytes) in context `ctx`.
  Decision on_call(uint64_t ctx, const void* key, size_t key_bytes, Dropped* dropped) {
    const uint64_t h = hash(ctx, key, key_bytes);
    Decision d;
    int e = find(h, ctx, key, key_bytes);
    if (e < 0) {
      e = insert(h, ctx, key, key_bytes, dropped);
      d.entry = e;
      if (entries_[e].sights >= sights_needed_) d.action = Action::kCapture;
      return d;
    }
    touch(e);
    Entry& x = entries_[e];
    d.entry = e;
    if (x.graph != nullptr) {
      if (x.replays < kPayoffReplays && ++x.replays == kPayoffReplays) {
        sights_needed_ = sights_needed_ / 2 < kMinSights ? kMinSights : sights_needed_ / 2;
      }
      d.action = Action::kReplay;
      d.graph = x.graph;
      return d;
    }
    if (x.sights < kMaxSights) ++x.sights;
    if (x.wait > 0) {
      --x.wait;
    } else if (x.sights >= sights_needed_) {
      d.action = Action::kCapture;
    }
    return d;
  }

  // The capture that on_call asked for made `graph`.
  void captured(int entry, void* graph) {
    entries_[entry].graph = graph;
    entries_[entry].replays = 0;
  }
  // The capture failed: direct launches, a retry after a wait that doubles per failure.
  void capture_failed(int entry) { back_off(entries_[entry]); }
  // Launching the graph on_call returned failed: the caller destroys the graph returned and
  // launches directly; the entry waits as after a failed capture.
  void* replay_failed(int entry) {
    Entry& x = entries_[entry];
    void* g = x.graph;
    x.graph = nullptr;
    back_off(x);
    return g;
  }

  // Forgets every entry of context `ctx`, passing each graph to drop(graph).
  template <class F>
  void release(uint64_t ctx, F&& drop) {
    for (int e = head_; e >= 0;) {
      const int next = entries_[e].next;
      if (entries_[e].ctx == ctx) {
        if (entries_[e].graph != nullptr) drop(entries_[e].graph);
        remove(e);
      }
      e = next;
    }
  }
  // Every graph held, with its context (the table unchanged).
  template <class F>
  void for_each_graph(F&& f) const {
    for (int e = head_; e >= 0; e = entries_[e].next) {
      if (entries_[e].graph != nullptr) f(entries_[e].graph, entries_[e].ctx);
    }
  }

  uint32_t sights_needed() const { return sights_needed_; }
  int size() const { return kCapacity - num_free_; }

 private:
  static constexpr int kBuckets = 2 * kCapacity;  // a power of two: load at most 1/2
  static_assert((kBuckets & (kBuckets - 1)) == 0 && kCapacity < 32768, "int16 indices");

  struct Entry {
    uint64_t hash;
    uint64_t ctx;
    size_t bytes;
    void* graph;
    uint32_t sights;   // calls while resident, up to kMaxSights
    uint32_t replays;  // of its graph, up to kPayoffReplays
    uint32_t wait;     // calls to launch directly before the next capture
    uint32_t failures;
    int16_t prev, next;  // by last use: head_ the most recent
    unsigned char key[kMaxLaunchKeyBytes];
  };

  // FNV-1a over the context and the key's 8-byte words (and its tail).
  static uint64_t hash(uint64_t ctx, const void* key, size_t bytes) {
    const unsigned char* p = static_cast<const unsigned char*>(key);
    uint64_t h = (1469598103934665603ull ^ ctx) * 1099511628211ull;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 1099511628211ull;
    }
    for (; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h ^ (h >> 29);  // the index takes the low bits
  }

  int find(uint64_t h, uint64_t ctx, const void* key, size_t bytes) const {
    for (int b = static_cast<int>(h & (kBuckets - 1));; b = (b + 1) & (kBuckets - 1)) {
      const int e = index_[b];
      if (e < 0) return -1;
      const Entry& x = entries_[e];
      if (x.hash == h && x.ctx == ctx && x.bytes == bytes && std::memcmp(x.key, key, bytes) == 0) {
        return e;
      }
    }
  }

  int insert(uint64_t h, uint64_t ctx, const void* key, size_t bytes, Dropped* dropped) {
    if (num_free_ == 0) {
      Entry& old = entries_[tail_];
      if (old.graph != nullptr) {
        if (old.replays < kPayoffReplays) {
          sights_needed_ = sights_needed_ * 2 > kMaxSights ? kMaxSights : sights_needed_ * 2;
        }
        dropped->graph = old.graph;
        dropped->ctx = old.ctx;
      }
      remove(tail_);
    }
    const int e = free_[--num_free_];
    Entry& x = entries_[e];
    x.hash = h;
    x.ctx = ctx;
    x.bytes = bytes;
    x.graph = nullptr;
    x.sights = 1;
    x.replays = 0;
    x.wait = 0;
    x.failures = 0;
    std::memcpy(x.key, key, bytes);
    int b = static_cast<int>(h & (kBuckets - 1));
    while (index_[b] >= 0) b = (b + 1) & (kBuckets - 1);
    index_[b] = static_cast<int16_t>(e);
    x.prev = -1;
    x.next = static_cast<int16_t>(head_);
    if (head_ >= 0) entries_[head_].prev = static_cast<int16_t>(e);
    head_ = e;
    if (tail_ < 0) tail_ = e;
    return e;
  }

  // Out of the index (backward-shift deletion keeps every probe chain unbroken), the order and
  // into the free list.
  void remove(int e) {
    int b = static_cast<int>(entries_[e].hash & (kBuckets - 1));
    while (index_[b] != e) b = (b + 1) & (kBuckets - 1);
    for (int next = (b + 1) & (kBuckets - 1);; next = (next + 1) & (kBuckets - 1)) {
      const int n = index_[next];
      if (n < 0) break;
      const int home = static_cast<int>(entries_[n].hash & (kBuckets - 1));
      // n may move into the hole at b unless its home lies cyclically in (b, next].
      if (((next - home) & (kBuckets - 1)) >= ((next - b) & (kBuckets - 1))) {
        index_[b] = static_cast<int16_t>(n);
        b = next;
      }
    }
    index_[b] = -1;
    unlink(e);
    free_[num_free_++] = static_cast<int16_t>(e);
  }

  void unlink(int e) {
    Entry& x = entries_[e];
    if (x.prev >= 0)
      entries_[x.prev].next = x.next;
    else
      head_ = x.next;
    if (x.next >= 0)
      entries_[x.next].prev = x.prev;
    else
      tail_ = x.prev;
  }

  void touch(int e) {
    if (head_ == e) return;
    unlink(e);
    Entry& x = entries_[e];
    x.prev = -1;
    x.next = static_cast<int16_t>(head_);
    entries_[head_].prev = static_cast<int16_t>(e);
    head_ = e;
  }

  static void back_off(Entry& x) {
    const uint32_t shift = x.failures < kMaxBackoff ? x.failures : kMaxBackoff;
    x.wait = kRetryCalls << shift;
    if (x.failures < kMaxBackoff) ++x.failures;
  }

  Entry entries_[kCapacity];
  int16_t index_[kBuckets];  // entry of each bucket, -1 empty
  int16_t free_[kCapacity];
  int num_free_ = 0;
  int head_ = -1, tail_ = -1;
  uint32_t sights_needed_ = kMinSights;
};

}  // namespace snapmla
