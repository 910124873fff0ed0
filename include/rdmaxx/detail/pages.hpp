/// \file
/// rdmaxx/detail/pages.hpp: page-aligned anonymous memory owned by an allocate-and-register MR.
#pragma once

#include "handle.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace rdmaxx::detail {

/// An anonymous private mapping: huge pages (MAP_HUGETLB) when the length is a multiple of the
/// 2 MiB huge page size and the system has them reserved, normal pages otherwise.
class owned_pages {
public:
  owned_pages() noexcept = default;
  owned_pages(owned_pages &&) noexcept = default;
  owned_pages &operator=(owned_pages &&o) noexcept {
    owned_pages tmp(std::move(o));
    std::swap(p_, tmp.p_);
    std::swap(len_, tmp.len_);
    std::swap(huge_, tmp.huge_);
    return *this;
  }
  ~owned_pages() {
    if (void *p = p_.release()) ::munmap(p, len_);
  }

  static constexpr std::size_t huge_page_size = std::size_t(2) << 20;

  /// mmap into this (empty) object; on failure it stays empty. An error code rather than a
  /// result<owned_pages>: one result<T> fewer for every TU (bench/compile).
  /// \errors
  /// - the errno of mmap (ENOMEM, also for a length that cannot be rounded up to pages).
  /// \mallocs The mapping: `length` rounded up to pages (2 MiB huge pages when `length` is a
  /// multiple of them and they are reserved).
  [[nodiscard]] std::error_code map(std::size_t length) noexcept {
    const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
    if (length > SIZE_MAX - (page - 1)) return errno_code(ENOMEM); // rounding up would wrap to 0
    if (length % huge_page_size == 0) {
      void *p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
      if (p != MAP_FAILED) {
        *this = owned_pages(p, length, true);
        return {};
      }
    }
    const std::size_t len = (length + page - 1) / page * page;
    void *p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return last_errno();
    *this = owned_pages(p, len, false);
    return {};
  }

  /// Give the mapping up to whoever destroys the region that uses it (detail::handle::reset):
  /// unmapped only after the region, which a deferred destruction may delay.
  [[nodiscard]] after_destroy hand_over() noexcept {
    if (!p_.get()) return {};
    return {&unmap, p_.release(), len_};
  }

  [[nodiscard]] void *data() const noexcept { return p_.get(); }
  [[nodiscard]] std::size_t mapped_length() const noexcept { return len_; }
  [[nodiscard]] bool huge() const noexcept { return huge_; }
  [[nodiscard]] explicit operator bool() const noexcept { return p_.get() != nullptr; }

private:
  static void unmap(void *p, std::size_t len) noexcept { ::munmap(p, len); }
  owned_pages(void *p, std::size_t len, bool huge) noexcept : p_(p), len_(len), huge_(huge) {}
  moved_ptr<void> p_;
  std::size_t len_ = 0;
  bool huge_ = false;
};

} // namespace rdmaxx::detail
