// Memory for the compiled proposers' large per-request arrays, on 2 MB pages where the kernel gives them.
//
// A suffix tree's step is a chain of dependent loads at random places in each request's node array, child
// map and token array; at a serving batch those arrays (256 requests x 2-4k tokens: ~80 MB) are far larger
// than what the TLB maps with 4 KB pages, so most loads also walk the page table. Linux hands out 2 MB pages
// ("transparent huge pages") to memory marked MADV_HUGEPAGE, which is the default only where
// /sys/kernel/mm/transparent_hugepage/enabled says "always"; malloc marks nothing, and gives each block
// above 128 KB a mapping of its own, too small for a 2 MB page anyway. Measured on this project's 2-core
// VM (THP "madvise"), the suffix tree's C++ step at 256 requests ran ~0.8x the time with its arrays on such
// pages (docs/notes/results-log.md).
//
// So blocks of at least kSmallest bytes come from chunks of kChunk bytes, 2 MB aligned and marked
// MADV_HUGEPAGE, cut in size classes four to a doubling (at most ~25% of a block unused) and kept on a
// free list per class when freed, for the next array of that class; a block above kChunk / 4 is a mapping
// of its own. Chunks are never unmapped, but free blocks beyond max(kChunk, a quarter of the bytes in use)
// give their pages back to the system, so what is held stays within ~1.25x what the trees use (plus 32 MB).
// Smaller blocks, and everything off Linux, go to malloc. Thread safe (the batched step grows trees on
// several threads); growing an array is rare next to using it, so one mutex serves.
//
// Memory: a 2 MB page is resident once any byte of it is touched, so capacity reserved and not yet used
// costs memory here where 4 KB pages left it untouched: at 256 requests of 2-4k tokens the process held
// 60-70 MB more (trees of ~150 MB). SPEC_PLUGINS_HUGE_PAGES=0 in the environment, read once at the first
// large allocation, sends every block to malloc instead.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace spec_plugins {

class PageArena {
 public:
  static constexpr size_t kSmallest = 16 << 10;  // below this, malloc
  static constexpr size_t kPage = 4 << 10;
  static constexpr size_t kHuge = 2 << 20;
  static constexpr size_t kChunk = 32 << 20;

  static void* allocate(size_t bytes) {
#if defined(__linux__)
    if (bytes >= kSmallest && instance().on_) return instance().take(bytes);
#endif
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }

  static void release(void* p, size_t bytes) {
#if defined(__linux__)
    if (bytes >= kSmallest && instance().on_) return instance().give(p, bytes);
#endif
    std::free(p);
  }

  // Bytes of blocks in use, free blocks still resident and single mappings: what the arena holds in memory
  // (chunks' pages never touched aside).
  static size_t held_bytes() {
#if defined(__linux__)
    PageArena& a = instance();
    std::lock_guard<std::mutex> lock(a.mu_);
    return a.in_use_ + a.resident_free_ + a.single_;
#else
    return 0;
#endif
  }

 private:
#if defined(__linux__)
  static PageArena& instance() {
    static PageArena* arena = new PageArena();  // never destroyed: blocks may be freed during exit
    return *arena;
  }

  PageArena() {
    const char* env = std::getenv("SPEC_PLUGINS_HUGE_PAGES");
    on_ = !(env && env[0] == '0' && env[1] == '\0');
  }

  // Size classes: 4 per doubling from kSmallest (base, 1.25, 1.5, 1.75 x base), each a whole number of 4 KB pages.
  static size_t size_of_class(size_t c) {
    const size_t base = kSmallest << (c / 4);
    return (base + c % 4 * (base / 4) + kPage - 1) / kPage * kPage;
  }

  // The smallest class that holds `bytes`, and its size.
  static size_t class_of(size_t bytes, size_t* size) {
    size_t c = 0;
    while ((kSmallest << (c / 4 + 1)) <= bytes) c += 4;  // the doubling that holds `bytes`
    while (size_of_class(c) < bytes) ++c;
    *size = size_of_class(c);
    return c;
  }

  static void* map(size_t bytes, size_t align) {
    // Over-map by `align` and trim, so the block starts on an `align` boundary (a 2 MB page needs one).
    const size_t len = bytes + align;
    void* raw = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const size_t addr = reinterpret_cast<size_t>(raw);
    const size_t start = (addr + align - 1) / align * align;
    if (start > addr) munmap(raw, start - addr);
    const size_t tail = addr + len - (start + bytes);
    if (tail) munmap(reinterpret_cast<void*>(start + bytes), tail);
    void* p = reinterpret_cast<void*>(start);
    madvise(p, bytes, MADV_HUGEPAGE);  // a hint: a kernel without transparent huge pages keeps 4 KB pages
    return p;
  }

  void* take(size_t bytes) {
    size_t size = 0;
    const size_t c = class_of(bytes, &size);
    if (size > kChunk / 4) {  // an array this large is a mapping of its own, returned when freed
      void* p = map(size, kHuge);
      std::lock_guard<std::mutex> lock(mu_);
      single_ += size;
      return p;
    }
    std::lock_guard<std::mutex> lock(mu_);
    in_use_ += size;
    std::vector<Free>& list = free_list(c);
    if (!list.empty()) {
      const Free f = list.back();
      list.pop_back();
      if (f.resident) resident_free_ -= size;
      return f.block;
    }
    if (left_ < size) {  // the rest of the chunk (< size) stays unused
      next_ = static_cast<char*>(map(kChunk, kHuge));
      left_ = kChunk;
    }
    void* p = next_;
    next_ += size;
    left_ -= size;
    return p;
  }

  void give(void* p, size_t bytes) {
    size_t size = 0;
    const size_t c = class_of(bytes, &size);
    if (size > kChunk / 4) {
      munmap(p, size);
      std::lock_guard<std::mutex> lock(mu_);
      single_ -= size;
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    in_use_ -= size;
    free_list(c).push_back(Free{p, true});
    resident_free_ += size;
    trim();
  }

  // Free blocks stay resident for the next array of their class up to max(kChunk, a quarter of the bytes in use);
  // past that the largest give their pages back to the system (their addresses stay on the lists), so what the
  // process holds stays bounded whatever mix of sizes comes and goes. With mu_ held.
  void trim() {
    const size_t limit = std::max(kChunk, in_use_ / 4);
    for (size_t c = free_.size(); c-- > 0 && resident_free_ > limit;) {
      const size_t size = size_of_class(c);
      for (Free& f : free_[c]) {
        if (!f.resident) continue;
        madvise(f.block, size, MADV_DONTNEED);  // the next use of the block faults fresh zero pages in
        f.resident = false;
        resident_free_ -= size;
        if (resident_free_ <= limit) return;
      }
    }
  }

  struct Free {
    void* block;
    bool resident;  // false: its pages were given back (MADV_DONTNEED), the next use faults them in again
  };
  std::vector<Free>& free_list(size_t c) {  // with mu_ held
    if (c >= free_.size()) free_.resize(c + 1);
    return free_[c];
  }
  bool on_ = true;  // fixed when the arena is made: every block is released the way it was allocated
  std::mutex mu_;
  std::vector<std::vector<Free>> free_;
  size_t in_use_ = 0, resident_free_ = 0;  // bytes of chunk blocks handed out / free and still resident
  char* next_ = nullptr;
  size_t left_ = 0;
  size_t single_ = 0;  // bytes in mappings of their own
#endif
};

// std::allocator's drop-in for the arrays that the arena should hold.
template <class T>
struct PageArenaAllocator {
  using value_type = T;
  PageArenaAllocator() = default;
  template <class U>
  PageArenaAllocator(const PageArenaAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(PageArena::allocate(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { PageArena::release(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const PageArenaAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const PageArenaAllocator<U>&) const { return false; }
};

template <class T>
using ArenaVector = std::vector<T, PageArenaAllocator<T>>;

}  // namespace spec_plugins
