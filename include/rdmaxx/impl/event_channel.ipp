/// \file
/// rdmaxx/impl/event_channel.ipp: the longer bodies of event_channel.hpp (see tools/check-headers),
/// out of the class declarations. Included at the end of event_channel.hpp; never include it
/// yourself.
#pragma once

namespace rdmaxx {

namespace detail {
inline cm_slot_ptr cm_slot_ptr::make(cm_hub &h, std::uint64_t cookie, std::uint32_t listener_queue) noexcept {
  cm_slot_ptr r;
  auto *s = new (std::nothrow) cm_slot;
  if (!s) return r;
  if (listener_queue) {
    s->q = new (std::nothrow) cm_event_copy[listener_queue];
    if (!s->q) {
      delete s;
      return r;
    }
    s->cap = listener_queue;
    s->listener = true;
  }
  s->hub = &h;
  s->cookie = cookie;
  r.p_ = s;
  return r;
}
} // namespace detail

// ---- EventChannel ----

inline result<EventChannel> EventChannel::create() noexcept {
  detail::parent_node *node = detail::new_parent_node();
  auto *hub = new (std::nothrow) detail::cm_hub;
  if (!node || !hub) {
    delete node;
    delete hub;
    return std::make_error_code(std::errc::not_enough_memory);
  }
  auto ch = detail::create_cm_channel();
  if (!ch) {
    delete node;
    delete hub;
    return ch.error();
  }
  hub->ch = ch.value().release();
  EventChannel c;
  c.h_ = detail::handle<detail::cm_hub_traits>(hub, nullptr, node);
  return c;
}

inline result<std::size_t> EventChannel::dispatch(std::span<std::uint64_t> ready) noexcept {
  if (!h_) return make_error_code(errc::null_handle);
  detail::cm_hub &h = *h_.get();
  auto pumped = detail::cm_pump(h, detail::cm_pump_batch);
  std::size_t n = 0;
  for (; n < ready.size() && h.first; ++n) {
    detail::cm_slot &s = *h.first;
    ready[n] = s.cookie;
    detail::cm_unmark(s);
  }
  if (!pumped && n == 0) return pumped.error();
  return n;
}

} // namespace rdmaxx
