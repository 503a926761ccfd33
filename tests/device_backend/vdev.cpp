// A PrivateUse1 device for tests: memory is host memory behind the device's own allocator, the copy kernels are
// memcpy, and every other operator runs on the CPU through PyTorch's CPU fallback (inputs copied to the CPU, the
// CPU kernel run, results copied back). Code that is device-agnostic runs on it unchanged; code that names
// "cpu" or "cuda" or reaches into a tensor's memory on the assumption that it is CPU memory does not.

#include <torch/extension.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace vdev {

constexpr c10::DeviceIndex kDeviceCount = 1;
thread_local c10::DeviceIndex current_device = 0;
std::atomic<int64_t> live_allocations{0};
std::atomic<int64_t> fallback_calls{0};

void free_block(void* ptr) {
  if (ptr != nullptr) {
    std::free(ptr);
    live_allocations--;
  }
}

struct DeviceAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    if (nbytes > 0) {
      ptr = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
      TORCH_CHECK(ptr != nullptr, "vdev: out of memory allocating ", nbytes, " bytes");
      live_allocations++;
    }
    return {ptr, ptr, &free_block, c10::Device(c10::DeviceType::PrivateUse1, current_device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

DeviceAllocator device_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &device_allocator);

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  GuardImpl() = default;
  explicit GuardImpl(c10::DeviceType t) { TORCH_CHECK(t == kType); }
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = current_device;
    current_device = d.index();
    return c10::Device(kType, old);
  }
  c10::Device getDevice() const override { return c10::Device(kType, current_device); }
  void setDevice(c10::Device d) const override { current_device = d.index(); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { current_device = d.index(); }
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDeviceCount; }
  // The device runs every kernel synchronously: events and streams have nothing to wait for.
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

struct GeneratorImpl : public at::CPUGeneratorImpl {
  explicit GeneratorImpl(c10::DeviceIndex index) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return kDeviceCount; }
  void setCurrentDevice(c10::DeviceIndex d) const override { current_device = d; }
  c10::DeviceIndex getCurrentDevice() const override { return current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = current_device;
    current_device = d;
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override { return exchangeDevice(d); }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    static at::Generator generator = at::make_generator<GeneratorImpl>(0);
    return generator;
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return at::make_generator<GeneratorImpl>(index);
  }
};

static bool hooks_registered [[maybe_unused]] = []() {
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  return true;
}();

constexpr c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>,
                               std::optional<c10::MemoryFormat> memory_format) {
  return at::detail::empty_generic(size, &device_allocator, kKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &device_allocator, kKeys, c10::dtype_or_default(dtype));
}

at::Tensor as_cpu(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor source = self.is_cpu() ? self : as_cpu(self);
  at::Tensor target = dst.is_cpu() ? dst : as_cpu(dst);
  target.copy_(source, non_blocking);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, storage_offset);
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Scalar local_scalar_dense(const at::Tensor& self) { return at::native::_local_scalar_dense_cpu(self); }

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) { return at::native::set_tensor_(self, source); }
at::Tensor& set_storage(at::Tensor& self, at::Storage source) { return at::native::set_(self, source); }
at::Tensor& set_storage_offset(at::Tensor& self, at::Storage storage, int64_t offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  return at::cpu::set_(self, storage, offset, size, stride);
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  fallback_calls++;
  at::native::cpu_fallback(op, stack);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("resize_", resize);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("view", view);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

}  // namespace vdev

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("live_allocations", []() { return vdev::live_allocations.load(); });
  m.def("fallback_calls", []() { return vdev::fallback_calls.load(); });
}
