// The decode graphs' bookkeeping (cpp/common/launch_cache.h) without CUDA: eviction order,
// capture and retry decisions, release, and a random sequence checked against a plain model.
// tests/test_launch_cache.py compiles and runs it; `sim` prints the capture and replay shares
// of model serving loops instead.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/launch_cache.h"

using snapmla::LaunchCache;
using Action = LaunchCache::Action;

static int failures = 0;
#define EXPECT(cond)                                                          \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      if (++failures == 20) std::exit(1);                                     \
    }                                                                         \
  } while (0)

namespace {

constexpr int kCap = LaunchCache::kCapacity;

// A launch key as decode.cu's: a few hundred bytes, varying in a pointer-like field.
struct Key {
  uint64_t words[40];
};
Key key_of(uint64_t id) {
  Key k;
  std::memset(&k, 0, sizeof(k));
  k.words[0] = 0x7f0000000000ull + id * 4096;  // an address
  k.words[17] = id % 7;
  return k;
}

void* graph_of(uint64_t n) { return reinterpret_cast<void*>(0x1000 + 16 * n); }

// Calls the cache as launch_repeated does, with captures succeeding; returns the action.
struct Driver {
  LaunchCache* cache;
  uint64_t next_graph = 1;
  long direct = 0, captures = 0, replays = 0, dropped = 0;
  Action call(uint64_t ctx, const Key& k, bool capture_fails = false) {
    LaunchCache::Dropped d;
    const LaunchCache::Decision x = cache->on_call(ctx, &k, sizeof(k), &d);
    if (d.graph != nullptr) ++dropped;
    if (x.action == Action::kCapture) {
      ++captures;
      if (capture_fails) {
        cache->capture_failed(x.entry);
      } else {
        cache->captured(x.entry, graph_of(next_graph++));
      }
    } else if (x.action == Action::kReplay) {
      ++replays;
    } else {
      ++direct;
    }
    return x.action;
  }
};

void test_capture_on_second_sight() {
  auto* c = new LaunchCache;
  LaunchCache::Dropped d;
  const Key k = key_of(1);
  EXPECT(c->on_call(1, &k, sizeof(k), &d).action == Action::kDirect);
  const LaunchCache::Decision x = c->on_call(1, &k, sizeof(k), &d);
  EXPECT(x.action == Action::kCapture);
  c->captured(x.entry, graph_of(9));
  const LaunchCache::Decision r = c->on_call(1, &k, sizeof(k), &d);
  EXPECT(r.action == Action::kReplay && r.graph == graph_of(9));
  // One byte of the key, or another context, is another call.
  Key k2 = k;
  reinterpret_cast<unsigned char*>(&k2)[200] ^= 1;
  EXPECT(c->on_call(1, &k2, sizeof(k2), &d).action == Action::kDirect);
  EXPECT(c->on_call(2, &k, sizeof(k), &d).action == Action::kDirect);
  EXPECT(c->on_call(1, &k, sizeof(k) - 8, &d).action == Action::kDirect);
  EXPECT(d.graph == nullptr && c->size() == 4);
  delete c;
}

void test_lru_not_fifo() {
  auto* c = new LaunchCache;
  Driver dr{c};
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kCap; ++i) dr.call(1, key_of(i));
  }
  EXPECT(dr.captures == kCap && c->size() == kCap);
  // Key 0, the oldest inserted, used again: a new key evicts key 1, the least recently used.
  EXPECT(dr.call(1, key_of(0)) == Action::kReplay);
  LaunchCache::Dropped d;
  const Key fresh = key_of(100000);
  c->on_call(1, &fresh, sizeof(fresh), &d);
  EXPECT(d.graph == graph_of(2));  // key 1's graph (graphs numbered from 1 in key order)
  EXPECT(dr.call(1, key_of(0)) == Action::kReplay);
  EXPECT(dr.call(1, key_of(1)) == Action::kDirect);  // seen anew
  delete c;
}

void test_cycles() {
  // A cycle of kCap keys replays from its third round on; one of kCap + 1 captures nothing.
  auto* c = new LaunchCache;
  Driver dr{c};
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < kCap; ++i) dr.call(1, key_of(i));
  }
  EXPECT(dr.captures == kCap && dr.replays == 3L * kCap && dr.dropped == 0);
  delete c;
  c = new LaunchCache;
  Driver dr2{c};
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i <= kCap; ++i) dr2.call(1, key_of(i));
  }
  EXPECT(dr2.captures == 0 && dr2.replays == 0 && dr2.dropped == 0);
  delete c;
}

void test_retry_after_failed_capture() {
  auto* c = new LaunchCache;
  Driver dr{c};
  const Key k = key_of(5);
  dr.call(1, k);
  EXPECT(dr.call(1, k, true) == Action::kCapture);  // fails
  uint32_t wait = LaunchCache::kRetryCalls;
  for (int failure = 1; failure <= LaunchCache::kMaxBackoff + 2; ++failure) {
    for (uint32_t i = 0; i < wait; ++i) EXPECT(dr.call(1, k) == Action::kDirect);
    EXPECT(dr.call(1, k, true) == Action::kCapture);  // retried, fails again
    if (failure <= LaunchCache::kMaxBackoff) wait *= 2;
  }
  EXPECT(wait == LaunchCache::kRetryCalls << LaunchCache::kMaxBackoff);
  for (uint32_t i = 0; i < wait; ++i) EXPECT(dr.call(1, k) == Action::kDirect);
  EXPECT(dr.call(1, k) == Action::kCapture);  // succeeds at last
  EXPECT(dr.call(1, k) == Action::kReplay);
  delete c;
}

void test_failed_replay() {
  auto* c = new LaunchCache;
  Driver dr{c};
  const Key k = key_of(6);
  dr.call(1, k);
  dr.call(1, k);
  LaunchCache::Dropped d;
  const LaunchCache::Decision x = c->on_call(1, &k, sizeof(k), &d);
  EXPECT(x.action == Action::kReplay);
  EXPECT(c->replay_failed(x.entry) == x.graph);
  for (uint32_t i = 0; i < LaunchCache::kRetryCalls; ++i) EXPECT(dr.call(1, k) == Action::kDirect);
  EXPECT(dr.call(1, k) == Action::kCapture);
  EXPECT(dr.call(1, k) == Action::kReplay);
  delete c;
}

void test_release() {
  auto* c = new LaunchCache;
  Driver dr{c};
  for (int i = 0; i < 3; ++i) {
    for (uint64_t ctx : {1, 2}) dr.call(ctx, key_of(i));
    for (uint64_t ctx : {1, 2}) dr.call(ctx, key_of(i));
  }
  std::vector<void*> dropped;
  c->release(1, [&](void* g) { dropped.push_back(g); });
  EXPECT(dropped.size() == 3 && c->size() == 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT(dr.call(2, key_of(i)) == Action::kReplay);
    EXPECT(dr.call(1, key_of(i)) == Action::kDirect);
    EXPECT(dr.call(1, key_of(i)) == Action::kCapture);
  }
  int held = 0;
  c->for_each_graph([&](void*, uint64_t) { ++held; });
  EXPECT(held == 6);
  c->release(1, [](void*) {});
  c->release(2, [](void*) {});
  EXPECT(c->size() == 0);
  delete c;
}

// Each graph evicted before kPayoffReplays replays doubles sights_needed, up to kMaxSights;
// each graph reaching them halves it.
void test_sights_steps() {
  auto* c = new LaunchCache;
  Driver dr{c};
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kCap; ++i) dr.call(1, key_of(i));  // kCap graphs, none replayed
  }
  const uint32_t want[] = {4, 8, 16, 32, 64, 64};
  for (int i = 0; i < 6; ++i) {
    dr.call(1, key_of(kCap + i));  // evicts key i's graph
    EXPECT(dr.dropped == i + 1 && c->sights_needed() == want[i]);
  }
  for (uint32_t n = 1; n < LaunchCache::kPayoffReplays; ++n) dr.call(1, key_of(kCap - 1));
  EXPECT(c->sights_needed() == 64);
  dr.call(1, key_of(kCap - 1));
  EXPECT(c->sights_needed() == 32);
  for (uint32_t n = 0; n < 2 * LaunchCache::kPayoffReplays; ++n) dr.call(1, key_of(kCap - 1));
  EXPECT(c->sights_needed() == 32);  // once per graph
  // A new key evicts another unreplayed graph (back to 64), and is captured at its 64th call.
  EXPECT(dr.call(1, key_of(5000)) == Action::kDirect && c->sights_needed() == 64);
  for (int n = 2; n < 64; ++n) EXPECT(dr.call(1, key_of(5000)) == Action::kDirect);
  EXPECT(dr.call(1, key_of(5000)) == Action::kCapture);
  delete c;
}

// Graphs evicted before they pay off raise the sights a capture needs; a working set that fits
// brings it back down and replays.
void test_adaptive_sights() {
  auto* c = new LaunchCache;
  Driver dr{c};
  std::mt19937_64 rng(7);
  // 61 layers, batch 1..64 at random, the buffers' addresses following the batch: 3904 keys.
  for (int step = 0; step < 3000; ++step) {
    const int b = static_cast<int>(rng() % 64);
    for (int l = 0; l < 61; ++l) dr.call(1, key_of(uint64_t(b) * 61 + l));
  }
  const long calls = 3000L * 61;
  EXPECT(c->sights_needed() > LaunchCache::kMinSights);
  EXPECT(dr.captures * 100 < calls);  // under 1% of the calls capture
  // Then 4 batch sizes only (244 keys): nearly every call replays.
  Driver dr2{c};
  for (int step = 0; step < 3000; ++step) {
    const int b = static_cast<int>(rng() % 4);
    for (int l = 0; l < 61; ++l) dr2.call(1, key_of(uint64_t(b) * 61 + l));
  }
  EXPECT(dr2.captures <= 244 && dr2.dropped == 0);
  EXPECT(dr2.replays > 3000L * 61 * 9 / 10);
  delete c;
}

// The policy in its plainest form (a vector ordered by last use), to compare with the cache's
// index, list and free slots over a random sequence.
struct Model {
  struct E {
    uint64_t ctx, id;
    void* graph;
    uint32_t sights, replays, wait, failures;
  };
  std::vector<E> order;  // front: most recent
  uint32_t need = LaunchCache::kMinSights;
  Action call(uint64_t ctx, uint64_t id, void** graph, void** dropped) {
    *dropped = nullptr;
    for (size_t i = 0; i < order.size(); ++i) {
      if (order[i].ctx != ctx || order[i].id != id) continue;
      E e = order[i];
      order.erase(order.begin() + i);
      Action a = Action::kDirect;
      if (e.graph != nullptr) {
        if (e.replays < LaunchCache::kPayoffReplays && ++e.replays == LaunchCache::kPayoffReplays) {
          need = std::max(need / 2, LaunchCache::kMinSights);
        }
        a = Action::kReplay;
        *graph = e.graph;
      } else {
        e.sights = std::min(e.sights + 1, LaunchCache::kMaxSights);
        if (e.wait > 0) {
          --e.wait;
        } else if (e.sights >= need) {
          a = Action::kCapture;
        }
      }
      order.insert(order.begin(), e);
      return a;
    }
    if (static_cast<int>(order.size()) == kCap) {
      const E& old = order.back();
      if (old.graph != nullptr && old.replays < LaunchCache::kPayoffReplays) {
        need = std::min(need * 2, LaunchCache::kMaxSights);
      }
      *dropped = old.graph;
      order.pop_back();
    }
    order.insert(order.begin(), E{ctx, id, nullptr, 1, 0, 0, 0});
    return Action::kDirect;
  }
  void back_off(E& e) {
    e.wait = LaunchCache::kRetryCalls << std::min<uint32_t>(e.failures, LaunchCache::kMaxBackoff);
    if (e.failures < LaunchCache::kMaxBackoff) ++e.failures;
  }
};

void test_random_against_model() {
  auto* c = new LaunchCache;
  Model m;
  std::mt19937_64 rng(11);
  uint64_t next_graph = 1;
  long raised = 0, lowered = 0;  // changes of sights_needed
  for (long i = 0; i < 400000; ++i) {
    // Two contexts, now and then a release; phases of 20000 calls alternate between ids that
    // fit (graphs pay off) and too many (graphs are evicted first), moving sights_needed.
    const uint64_t r = rng();
    const uint64_t universe = (i / 20000) % 2 ? 3 * kCap : kCap / 2;
    const uint64_t id = (r % 4 == 0) ? (r >> 8) % (3 * kCap) : (r >> 8) % universe;
    const uint64_t ctx = 1 + (r >> 40) % 2;
    if ((r >> 50) % 20000 == 0) {
      std::vector<void*> a;
      c->release(ctx, [&](void* g) { a.push_back(g); });
      size_t b = 0;
      for (size_t j = 0; j < m.order.size();) {
        if (m.order[j].ctx == ctx) {
          b += m.order[j].graph != nullptr;
          m.order.erase(m.order.begin() + j);
        } else {
          ++j;
        }
      }
      EXPECT(a.size() == b);
      continue;
    }
    const Key k = key_of(id);
    LaunchCache::Dropped d;
    const LaunchCache::Decision x = c->on_call(ctx, &k, sizeof(k), &d);
    void* mg = nullptr;
    void* md = nullptr;
    const uint32_t need_before = m.need;
    const Action ma = m.call(ctx, id, &mg, &md);
    raised += m.need > need_before;
    lowered += m.need < need_before;
    if (x.action != ma || d.graph != md || (ma == Action::kReplay && x.graph != mg)) {
      std::fprintf(stderr, "step %ld: cache and model differ\n", i);
      ++failures;
      break;
    }
    Model::E& e = m.order.front();
    const int fate = static_cast<int>((r >> 56) % 16);  // 1 in 16 captures or replays fail
    if (x.action == Action::kCapture) {
      if (fate == 0) {
        c->capture_failed(x.entry);
        m.back_off(e);
      } else {
        void* g = graph_of(next_graph++);
        c->captured(x.entry, g);
        e.graph = g;
        e.replays = 0;
      }
    } else if (x.action == Action::kReplay && fate == 0) {
      EXPECT(c->replay_failed(x.entry) == e.graph);
      e.graph = nullptr;
      m.back_off(e);
    }
  }
  EXPECT(c->size() == static_cast<int>(m.order.size()));
  EXPECT(c->sights_needed() == m.need);
  EXPECT(raised > 0 && lowered > 0);
  delete c;
}

// Shares of calls that capture and replay in model serving loops (61 layers a step).
void simulate() {
  struct Loop {
    const char* name;
    int batches;   // batch sizes drawn from
    bool walk;     // the batch moves by -2..2 a step instead of being drawn anew
    int variants;  // address variants of a batch's buffers (allocator churn)
  };
  const Loop loops[] = {{"steady", 1, false, 1},
                        {"4 batch sizes", 4, false, 1},
                        {"8 batch sizes", 8, false, 1},
                        {"batch 1..64", 64, false, 1},
                        {"batch 1..64, walk", 64, true, 1},
                        {"4 sizes x 4 addresses", 4, false, 4}};
  std::printf("%-24s %9s %9s %9s %8s\n", "loop (61 layers)", "capture%", "replay%", "evicted%",
              "sights");
  for (const Loop& loop : loops) {
    auto* c = new LaunchCache;
    Driver dr{c};
    std::mt19937_64 rng(3);
    int b = 0;
    const int steps = 5000;
    for (int s = 0; s < steps; ++s) {
      if (loop.walk) {
        b = std::min(loop.batches - 1, std::max(0, b + static_cast<int>(rng() % 5) - 2));
      } else {
        b = static_cast<int>(rng() % loop.batches);
      }
      const int v = static_cast<int>(rng() % loop.variants);
      for (int l = 0; l < 61; ++l) dr.call(1, key_of((uint64_t(b) * loop.variants + v) * 61 + l));
    }
    const double calls = 61.0 * steps;
    std::printf("%-24s %9.2f %9.2f %9.2f %8u\n", loop.name, 100 * dr.captures / calls,
                100 * dr.replays / calls, 100 * dr.dropped / calls, c->sights_needed());
    delete c;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "sim") == 0) {
    simulate();
    return 0;
  }
  test_capture_on_second_sight();
  test_lru_not_fifo();
  test_cycles();
  test_retry_after_failed_capture();
  test_failed_replay();
  test_release();
  test_sights_steps();
  test_adaptive_sights();
  test_random_against_model();
  if (failures != 0) {
    std::fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  std::printf("launch_cache: all checks passed\n");
  return 0;
}
