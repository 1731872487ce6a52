// podium::data::Engine (engine.h): the UCX context and worker, the process's engine, memory
// registration and the memory types UCX can reach.
#include "podium/data/engine_impl.h"

namespace podium::data {

std::string Engine::ucx_version() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

namespace {

bool has_cuda(ucp_context_h ctx) {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  return ucp_context_query(ctx, &attr) == UCS_OK &&
         (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

// UCX's context for `config`: impl.ctx, impl.net_devices (DA-21, DA-22, DA-24); without UCX's
// tcp transport when `exclude_tcp` (DA-51).
Status init_context(const EngineConfig& config, Engine::Impl& impl, bool exclude_tcp) {
  const char* tls_env = std::getenv("UCX_TLS");
  ucp_config_t* cfg = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &cfg);
  if (st != UCS_OK) return std::unexpected(ucx_error(DataErrc::kUnavailable, "ucp_config_read", st));
  // DA-21: the environment's choice wins; else the devices the caller named.
  if (const char* env = std::getenv("UCX_NET_DEVICES"); env != nullptr && *env != '\0') {
    impl.net_devices = env;
  } else if (!config.net_devices.empty()) {
    st = ucp_config_modify(cfg, "NET_DEVICES", config.net_devices.c_str());
    if (st != UCS_OK) {
      ucp_config_release(cfg);
      return std::unexpected(ucx_error(
          DataErrc::kUnavailable, "UCX refused NET_DEVICES=" + config.net_devices, st));
    }
    impl.net_devices = config.net_devices;
  }
  // DA-22: UCX's TCP segments, large unless the environment sets them (see engine.h). The
  // names are the tcp transport's own (UCX applies them to every transport that has them);
  // set only where tcp may run, since UCX warns about options no transport takes.
  std::string tls = tls_env ? tls_env : "";
  if (exclude_tcp) {
    st = ucp_config_modify(cfg, "TLS", "^tcp");
    if (st != UCS_OK) {
      ucp_config_release(cfg);
      return std::unexpected(ucx_error(DataErrc::kUnavailable, "UCX refused TLS=^tcp", st));
    }
  } else if (tls.empty() || tls[0] == '^' || tls.find("tcp") != std::string::npos ||
             tls.find("all") != std::string::npos) {
    for (const auto& [name, value] : kTcpSegDefaults) {
      if (std::getenv(("UCX_TCP_" + std::string(name)).c_str()) == nullptr) {
        ucp_config_modify(cfg, name, value);
      }
    }
  }
  // DA-24: UCX's pipelined RMA protocols, unless the environment says otherwise. Only where
  // the option is known to exist: an older UCX keeps the unknown name and warns about it.
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  if (std::getenv("UCX_RMA_PPLN_ENABLE") == nullptr && (major > 1 || minor >= kRmaPplnMinor)) {
    (void)ucp_config_modify(cfg, "RMA_PPLN_ENABLE", "y");
  }
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES;
  p.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  st = ucp_init(&p, cfg, &impl.ctx);
  ucp_config_release(cfg);
  if (st != UCS_OK) return std::unexpected(ucx_error(DataErrc::kUnavailable, "ucp_init", st));
  return {};
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::make(EngineConfig config) {
  if (config.chunk_bytes == 0 || config.window == 0) {
    return std::unexpected(
        make_error(DataErrc::kInvalidArgument, "chunk_bytes and window must be positive"));
  }
  if (config.copiers == 0) config.copiers = default_copiers();
  if (config.spin.count() < 0) config.spin = default_spin();  // DA-34
  auto impl = std::make_shared<Impl>();
  impl->config = config;
  impl->stats.copiers = config.copiers;
  if (const char* tls = std::getenv("UCX_TLS")) {
    std::string t(tls);
    bool shm = false;
    for (const char* name : {"sm", "shm", "posix", "sysv", "cma", "xpmem", "knem", "all"}) {
      size_t at = t.find(name);
      while (at != std::string::npos && !shm) {
        bool start = at == 0 || t[at - 1] == ',' || t[at - 1] == '^';
        size_t end = at + std::string(name).size();
        shm = start && (end == t.size() || t[end] == ',');
        at = t.find(name, at + 1);
      }
    }
    impl->tls_restricted_to_tcp(t, shm);
  }
  // DA-51: UCX's tcp transport left out where podium's TCP path stands in for it, except
  // in a UCX with CUDA support.
  const char* tls_env = std::getenv("UCX_TLS");
  bool exclude_tcp = config.without_tcp && (tls_env == nullptr || *tls_env == '\0');
  if (auto made = init_context(config, *impl, exclude_tcp); !made) {
    return std::unexpected(made.error());
  }
  if (exclude_tcp && has_cuda(impl->ctx)) {
    ucp_cleanup(impl->ctx);
    impl->ctx = nullptr;
    exclude_tcp = false;
    if (auto made = init_context(config, *impl, false); !made) {
      return std::unexpected(made.error());
    }
  }
  impl->ucx_tcp = !exclude_tcp;
  ucs_status_t st = UCS_OK;
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  impl->cuda_memory = ucp_context_query(impl->ctx, &attr) == UCS_OK &&
                      (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;  // DA-23
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(impl->ctx, &wp, &impl->worker);
  if (st != UCS_OK) return std::unexpected(ucx_error(DataErrc::kUnavailable, "ucp_worker_create", st));
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(impl->worker, &addr, &len);
  if (st != UCS_OK) {
    return std::unexpected(ucx_error(DataErrc::kUnavailable, "ucp_worker_get_address", st));
  }
  impl->address.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(impl->worker, addr);
  if (ucp_worker_get_efd(impl->worker, &impl->efd) != UCS_OK) impl->efd = -1;
  impl->cma_enabled = cma_allowed();
  impl->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->wake_fd < 0) return std::unexpected(errno_error("eventfd", errno));
  impl->progress = std::thread([raw = impl.get()] { raw->run(); });
  for (size_t i = 1; i < config.copiers; ++i) {
    impl->copy_threads.emplace_back([raw = impl.get()] { raw->copy_loop(); });
  }
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

namespace {
std::once_flag g_instance_once;
Engine* g_instance = nullptr;
Error* g_instance_error = nullptr;

void stop_instance() {
  if (g_instance) g_instance->stop();
}
}  // namespace

Result<Engine*> Engine::instance(std::string_view net_devices, bool without_tcp) {
  std::call_once(g_instance_once, [net_devices, without_tcp] {
    auto env = [](const char* name, long long low, long long high, auto fallback) {
      const char* c = std::getenv(name);
      long long v = c ? std::atoll(c) : 0;
      return c && v >= low ? static_cast<decltype(fallback)>(std::min(v, high)) : fallback;
    };
    EngineConfig config;
    config.net_devices = std::string(net_devices);
    config.without_tcp = without_tcp;  // DA-51
    config.chunk_bytes = env("PODIUM_RDMA_CHUNK_BYTES", 1, 1LL << 40, config.chunk_bytes);
    config.nice = env("PODIUM_RDMA_NICE", 0, 19, config.nice);
    config.copiers = env("PODIUM_RDMA_CMA_THREADS", 1, 16, config.copiers);  // DA-11
    auto e = make(config);
    if (!e) {
      g_instance_error = new Error(e.error());
      return;
    }
    // Intentionally leaked: registrations may outlive any static destructor. Its thread is
    // joined at exit, before UCX's own library destructors run.
    g_instance = e->release();
    std::atexit(stop_instance);
  });
  if (g_instance) return g_instance;
  return std::unexpected(*g_instance_error);
}

const std::string& Engine::address() const { return impl_->address; }

const std::string& Engine::net_devices() const { return impl_->net_devices; }

bool Engine::ucx_tcp() const { return impl_->ucx_tcp; }


bool Engine::supports(Memory memory) const {
  return memory == Memory::kHost || impl_->cuda_memory;
}

Result<std::shared_ptr<Registration>> Engine::register_memory(const void* addr, size_t size,
                                                                std::shared_ptr<const void> keep,
                                                                Memory memory, bool share) {
  if (addr == nullptr || size == 0) {
    return std::unexpected(
        make_error(DataErrc::kInvalidArgument, "cannot register an empty region"));
  }
  if (!supports(memory)) {  // DA-23
    return std::unexpected(make_error(
        DataErrc::kUnavailable,
        "this process's UCX (" + ucx_version() +
            ") has no CUDA support: CUDA memory cannot be registered (build podium against a "
            "CUDA-enabled UCX with PODIUM_UCX_ROOT, docs/data.md \"GPU memory\")"));
  }
  auto key = std::make_pair(reinterpret_cast<uint64_t>(addr), size);
  auto registered = [&]() -> std::shared_ptr<Registration> {  // DA-2, under mu
    auto it = impl_->regs.find(key);
    return it != impl_->regs.end() ? it->second.lock() : nullptr;
  };
  std::shared_ptr<shm::SharedPages> pages;
  bool cma = false;
  {
    std::lock_guard lock(impl_->mu);
    if (auto r = registered()) return r;
    cma = impl_->cma_enabled;
  }
  // DA-29, before UCX maps the pages (a NIC's registration would hold the old ones), and
  // outside the lock (it copies the region). A failure leaves the region as it was: CMA.
  if (share && memory == Memory::kHost && cma && shm::enabled()) {  // DA-38: unless told not to
    auto shared = shm::share_pages(addr, size, shm::min_bytes(), keep);
    if (shared) pages = std::move(*shared);
  }
  std::lock_guard lock(impl_->mu);
  if (auto r = registered()) return r;
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = const_cast<void*>(addr);
  mp.length = size;
  if (memory == Memory::kCuda) {  // DA-23
    mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    mp.memory_type = UCS_MEMORY_TYPE_CUDA;
  }
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(impl_->ctx, &mp, &memh);
  if (st != UCS_OK) {
    return std::unexpected(ucx_error(DataErrc::kUnavailable,
                                     "ucp_mem_map of " + human_bytes(size), st));
  }
  void* packed = nullptr;
  size_t packed_len = 0;
  st = ucp_rkey_pack(impl_->ctx, memh, &packed, &packed_len);
  if (st != UCS_OK) {
    ucp_mem_unmap(impl_->ctx, memh);
    return std::unexpected(ucx_error(DataErrc::kUnavailable, "ucp_rkey_pack", st));
  }
  std::shared_ptr<Registration> r(new Registration());
  r->rkey_.assign(static_cast<const char*>(packed), packed_len);
  ucp_rkey_buffer_release(packed);
  r->engine_ = impl_;
  r->memh_ = memh;
  r->addr_ = key.first;
  r->size_ = size;
  r->keep_ = std::move(keep);
  r->pages_ = std::move(pages);
  impl_->regs[key] = r;
  ++impl_->live_regs;
  return r;
}

size_t Engine::registration_count() const {
  std::lock_guard lock(impl_->mu);
  return impl_->live_regs;
}


}  // namespace podium::data
