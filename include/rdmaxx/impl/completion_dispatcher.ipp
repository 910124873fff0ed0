/// \file
/// rdmaxx/impl/completion_dispatcher.ipp: the longer bodies of completion_dispatcher.hpp (see
/// tools/check-headers), out of the class declarations. Included at the end of
/// completion_dispatcher.hpp; never include it yourself.
#pragma once

namespace rdmaxx {

template <class T, class OnOther, class Room>
inline result<void> CompletionDispatcher::settle_impl(T &obj, int timeout_ms, OnOther &on_other, Room room) noexcept {
  if (!cq_ || !obj) return make_error_code(errc::null_handle);
  const void *owner = detail::target_ops<T>::key(obj);
  if (!targets_->t.contains(owner)) return make_error_code(errc::wrong_state);
  const std::int64_t deadline = detail::monotonic_ms() + timeout_ms;
  std::error_code failed;
  std::array<ibv_wc, 16> wcs;
  while (detail::target_ops<T>::unconfirmed(obj)) {
    const std::size_t r = room() < wcs.size() ? room() : wcs.size();
    if (r == 0) return make_error_code(errc::unexpected_completion);
    const std::int64_t left = deadline - detail::monotonic_ms();
    RDMAXX_TRY(n, cq_->wait(detail::span_of(wcs.data(), r), left > 0 ? int(left) : 0));
    std::size_t k = 0;
    for (std::size_t i = 0; i < n; ++i) {
      ibv_wc wc = wcs[i];
      if (const void *by = targets_->t.route(wc)) {
        if (by == owner && wc.status != IBV_WC_SUCCESS && !failed) failed = wc_error(wc);
      } else {
        wcs[k++] = wc;
      }
    }
    if (k) on_other(detail::span_of(wcs.data(), k));
  }
  if (failed) return failed;
  return success();
}

} // namespace rdmaxx
