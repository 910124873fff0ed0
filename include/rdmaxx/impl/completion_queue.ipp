/// \file
/// rdmaxx/impl/completion_queue.ipp: the longer bodies of completion_queue.hpp (see tools/check-headers), out of the
/// class declarations. Included at the end of completion_queue.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

[[nodiscard]] inline result<std::size_t> CompletionQueue::wait(std::span<ibv_wc> out, int timeout_ms) noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  if (out.empty()) return make_error_code(errc::zero_length);
  ibv_comp_channel *ch = h_.get()->channel;
  const std::int64_t deadline = detail::monotonic_ms() + timeout_ms;
  if (!ch) {
    for (unsigned spins = 0;; ++spins) {
      RDMAXX_TRY(n, poll(out));
      if (n) return n;
      if ((spins & 63) == 63 && detail::monotonic_ms() >= deadline)
        return make_error_code(errc::timeout);
    }
  }
  for (;;) {
    RDMAXX_TRY(n, poll(out));
    if (n) return n;
    RDMAXX_TRYV(arm());
    RDMAXX_TRY(m, poll(out));
    if (m) return m;
    const std::int64_t left = deadline - detail::monotonic_ms();
    if (left <= 0) return make_error_code(errc::timeout);
    pollfd p{ch->fd, POLLIN, 0};
    const int pr = ::poll(&p, 1, int(left));
    if (pr < 0 && errno != EINTR) return last_errno();
    if (pr <= 0) continue; // timeout or EINTR: the loop re-checks the deadline
    event_pending_ = true;  // taken by the next arm(), after the completions went to the caller
  }
}

[[nodiscard]] inline result<ibv_cq *> CompletionChannel::get_event(int timeout_ms) noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  if (timeout_ms < 0) return make_error_code(errc::invalid_argument);
  const std::int64_t deadline = detail::monotonic_ms() + timeout_ms;
  for (;;) {
    const std::int64_t left = deadline - detail::monotonic_ms();
    pollfd p{h_.get()->fd, POLLIN, 0};
    const int pr = ::poll(&p, 1, left > 0 ? int(left) : 0);
    if (pr < 0 && errno != EINTR) return last_errno();
    if (pr > 0) break;
    if (left <= 0) return make_error_code(errc::timeout);
  }
  ibv_cq *cq = nullptr;
  void *ctx = nullptr;
  if (::ibv_get_cq_event(h_.get(), &cq, &ctx)) return last_errno();
  return cq;
}

template <class OnOther>
  requires std::invocable<OnOther &, std::span<ibv_wc>>
inline result<ibv_wc> CompletionQueue::wait_for(std::uint64_t wr_id, int timeout_ms, OnOther &&on_other) noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  const std::int64_t deadline = detail::monotonic_ms() + timeout_ms;
  std::array<ibv_wc, 16> wcs;
  for (;;) {
    const std::int64_t left = deadline - detail::monotonic_ms();
    RDMAXX_TRY(n, wait(detail::span_of(wcs.data(), wcs.size()), left > 0 ? int(left) : 0));
    bool found = false;
    ibv_wc hit{};
    std::size_t k = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (!found && wcs[i].wr_id == wr_id) {
        hit = wcs[i];
        found = true;
      } else {
        wcs[k++] = wcs[i];
      }
    }
    if (k != 0) on_other(detail::span_of(wcs.data(), k));
    if (found) {
      if (auto ec = wc_error(hit)) return ec;
      return hit;
    }
  }
}

} // namespace rdmaxx
