// Streams and events of `tpu`. Each device runs programs from one in-order queue, so
// streams are labels over that queue: distinct ids (what code comparing streams
// sees) and a per-thread current stream per device, but any order CUDA code sets up
// between streams (wait_stream, events) already holds.
#pragma once
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace tpu::backend {

c10::Stream current_stream(c10::DeviceIndex device);
// This thread's default stream: the main thread's (and autograd's device threads') is
// id 0, every other thread's its own, as with CUDA's per-thread default streams.
c10::Stream default_stream(c10::DeviceIndex device);
c10::Stream exchange_stream(const c10::Stream& s);  // returns the previous current one
c10::Stream new_stream(c10::DeviceIndex device);
// Which thread's work the current stream on `device` carries: the id of a thread's
// default stream (a stream made by a thread counts as that thread's). DeferAndFuse keeps
// a pending graph per device and lane, so threads interleaving ops on one device do not
// cut each other's graphs at points that depend on timing; autograd replays a backward
// node on its forward's stream, so a backward joins the lane of the thread that ran
// the forward.
int64_t recording_lane(int device);

void record_event(void** event, const c10::Stream& s, c10::EventFlag flag);
bool query_event(void* event);
void synchronize_event(void* event);
void destroy_event(void* event) noexcept;
double elapsed_ms(void* start, void* end);

}  // namespace tpu::backend
