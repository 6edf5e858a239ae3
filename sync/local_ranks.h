// Ranks as threads of one process over Gloo (c10d allows it): tests and single-machine benches.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sync/communicator.h"
#include "sync/store.h"

namespace crl::sync {

// Runs body(rank, world communicator, store) for `n` Gloo ranks, each a thread, over a fresh TCP
// store on 127.0.0.1; returns each rank's error ("" = ok) after every thread ended.
std::vector<std::string> run_local_ranks(
    int n, std::chrono::milliseconds timeout,
    const std::function<void(int, std::unique_ptr<Communicator>&, const StorePtr&)>& body);

}  // namespace crl::sync
