// The suffix tree's child index (tree.hpp): (parent node, first token of the edge) -> child node, one
// open-addressing hash map per tree, with linear probing and backward-shift deletion (no tombstones). Its slots
// are on 2 MB pages (page_arena.hpp): a step probes them at random. While a tree appends tentatively
// (tree.hpp, "tentative appends") every slot write is journaled, so the map can be restored exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include "../page_arena.hpp"

namespace suffix_tree {

using i32 = std::int32_t;
using u64 = std::uint64_t;

constexpr i32 kNone = -1;

class ChildMap {
 public:
  ChildMap() { rehash(16); }

  i32 find(i32 parent, i32 tok) const {
    const u64 k = key(parent, tok);
    for (size_t i = home(k);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == k) return s.val;
      if (s.key == kEmpty) return kNone;
    }
  }

  void insert(i32 parent, i32 tok, i32 child) {  // the key must be absent
    if ((size_ + 1) * 2 > slots_.size()) {
      if (journal_) throw std::logic_error("ChildMap: rehash while journaling (reserve before)");
      rehash(slots_.size() * 2);
    }
    put(key(parent, tok), child);
    ++size_;
  }

  void assign(i32 parent, i32 tok, i32 child) {
    const size_t i = locate(key(parent, tok));
    write(i, Slot{slots_[i].key, child});
  }

  // Starts loading the slot where (parent, tok) would be: the caller probes it soon, and trees of many
  // requests together do not fit in cache.
  void prefetch(i32 parent, i32 tok) const { __builtin_prefetch(&slots_[home(key(parent, tok))]); }

  void erase(i32 parent, i32 tok) {
    size_t i = locate(key(parent, tok));
    write(i, Slot{kEmpty, slots_[i].val});
    --size_;
    // Shift back later entries of the probe run that would otherwise become unreachable.
    for (size_t j = (i + 1) & mask_; slots_[j].key != kEmpty; j = (j + 1) & mask_) {
      const size_t h = home(slots_[j].key);
      const bool stays = (i < j) ? (i < h && h <= j) : (i < h || h <= j);
      if (!stays) {
        write(i, slots_[j]);
        write(j, Slot{kEmpty, slots_[j].val});
        i = j;
      }
    }
  }

  void reserve(size_t n) {
    size_t cap = slots_.size();
    while (n * 2 > cap) cap *= 2;
    if (cap != slots_.size()) rehash(cap);
  }

  size_t size() const { return size_; }
  size_t bytes() const { return slots_.capacity() * sizeof(Slot); }

  // Journal (Tree's tentative appends): while on, every slot write first records the slot's old
  // contents, so undo() can restore the map exactly. Inserts must not rehash meanwhile (reserve first).
  void journal(bool on) {
    journal_ = on;
    log_.clear();
  }
  size_t journal_size() const { return log_.size(); }
  void undo(size_t to, size_t size) {  // back to when the journal held `to` records and the map `size` keys
    for (size_t i = log_.size(); i > to; --i) slots_[log_[i - 1].first] = log_[i - 1].second;
    log_.resize(to);
    size_ = size;
  }

 private:
  struct Slot {
    u64 key;
    i32 val;
  };
  void write(size_t i, Slot s) {
    if (__builtin_expect(journal_, false)) log_slot(i);
    slots_[i] = s;
  }
  __attribute__((noinline, cold)) void log_slot(size_t i) { log_.emplace_back(i, slots_[i]); }
  static constexpr u64 kEmpty = ~u64(0);  // parent and token are both < 2^31, so never a real key

  static u64 key(i32 parent, i32 tok) { return (u64(std::uint32_t(parent)) << 32) | std::uint32_t(tok); }
  size_t home(u64 k) const { return size_t((k * 0x9E3779B97F4A7C15ull) >> shift_); }

  size_t locate(u64 k) const {
    size_t i = home(k);
    while (slots_[i].key != k) i = (i + 1) & mask_;
    return i;
  }

  void put(u64 k, i32 v) {
    size_t i = home(k);
    while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
    write(i, Slot{k, v});
  }

  void rehash(size_t cap) {
    spec_plugins::ArenaVector<Slot> old;
    old.swap(slots_);
    slots_.assign(cap, Slot{kEmpty, 0});
    mask_ = cap - 1;
    shift_ = 64;
    for (size_t c = cap; c > 1; c >>= 1) --shift_;
    for (const Slot& s : old)
      if (s.key != kEmpty) put(s.key, s.val);
  }

  spec_plugins::ArenaVector<Slot> slots_;  // on 2 MB pages (page_arena.hpp): probed at random
  size_t mask_ = 0, size_ = 0;
  int shift_ = 64;
  bool journal_ = false;
  std::vector<std::pair<size_t, Slot>> log_;
};

}  // namespace suffix_tree
