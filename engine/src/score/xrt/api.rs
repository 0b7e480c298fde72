//! XRT's C API (xrt_device.h, xrt_kernel.h, xrt_bo.h), loaded at run time with libloading: no
//! XRT at build time, none needed to run, and the same code drives a card or the emulator in
//! `fpga/emu/`. Handles are wrapped so each is closed exactly once; every call's failure becomes
//! an [`XrtError`] naming the call and errno.
//!
//! Never call into a real XRT before [`super::probe`] said it is safe: with `XILINX_XRT` unset
//! or wrong, XRT 2.13 throws a C++ exception through its C API, which aborts the process.

use super::error::XrtError;
use crate::error::Result;
use libloading::Library;
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

type Handle = *mut c_void;

/// XRT's `XCL_BO_FLAGS_P2P`: device memory the host (and an NVMe drive) can reach over PCIe.
const BO_FLAGS_P2P: u64 = 1 << 30;
const BO_FLAGS_NONE: u64 = 0;
const SYNC_TO_DEVICE: c_int = 0;
const SYNC_FROM_DEVICE: c_int = 1;
/// `ERT_CMD_STATE_COMPLETED`.
const RUN_COMPLETED: c_int = 4;

/// The entry points Hillside uses.
struct Api {
    device_open: unsafe extern "C" fn(c_uint) -> Handle,
    device_close: unsafe extern "C" fn(Handle) -> c_int,
    load_xclbin_file: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    xclbin_uuid: unsafe extern "C" fn(Handle, *mut u8) -> c_int,
    kernel_open: unsafe extern "C" fn(Handle, *const u8, *const c_char) -> Handle,
    kernel_close: unsafe extern "C" fn(Handle) -> c_int,
    arg_group_id: unsafe extern "C" fn(Handle, c_int) -> c_int,
    bo_alloc: unsafe extern "C" fn(Handle, usize, u64, u32) -> Handle,
    bo_free: unsafe extern "C" fn(Handle) -> c_int,
    bo_map: unsafe extern "C" fn(Handle) -> *mut c_void,
    bo_sync: unsafe extern "C" fn(Handle, c_int, usize, usize) -> c_int,
    run_open: unsafe extern "C" fn(Handle) -> Handle,
    // Variadic in C: a buffer argument travels as its handle, a scalar as an unsigned int.
    run_set_arg: unsafe extern "C" fn(Handle, c_int, ...) -> c_int,
    run_start: unsafe extern "C" fn(Handle) -> c_int,
    run_wait: unsafe extern "C" fn(Handle) -> c_int,
    run_close: unsafe extern "C" fn(Handle) -> c_int,
}

/// A loaded XRT library. Dropped last: every handle keeps it alive.
pub struct Xrt {
    api: Api,
    path: PathBuf,
    /// Present when the library is Hillside's own emulator (it exports `hillsideXrtEmulator`).
    emulator: Option<String>,
    _lib: Library,
}

/// XRT's version from the file name `path` resolves to (`libxrt_coreutil.so.2.13.0`): its C
/// API does not report one, and this needs no call into it.
pub fn file_version(path: &Path) -> String {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let name = real.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match name.split_once(".so.") {
        Some((_, version)) => format!("XRT {version}"),
        None => "XRT (version unknown)".into(),
    }
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn check(call: &str, rc: c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(XrtError::Call { call: call.to_string(), source: std::io::Error::from_raw_os_error(rc.abs()) }.into())
    }
}

impl Xrt {
    /// Loads the library at `path` and resolves every entry point; a missing symbol is an error
    /// naming it.
    pub fn load(path: &Path) -> Result<Arc<Self>> {
        // SAFETY: loading runs the library's initializers; XRT's and the emulator's are benign
        // (XRT's risky work happens at the first device call, which the probe guards).
        let lib =
            unsafe { Library::new(path) }.map_err(|source| XrtError::Load { path: path.to_path_buf(), source })?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the type is the C prototype of this symbol in XRT 2.13's headers.
                *unsafe { lib.get($name) }.map_err(|source| XrtError::MissingSymbol {
                    path: path.to_path_buf(),
                    symbol: String::from_utf8_lossy(&$name[..$name.len() - 1]).into_owned(),
                    source,
                })?
            };
        }
        let api = Api {
            device_open: sym!(b"xrtDeviceOpen\0"),
            device_close: sym!(b"xrtDeviceClose\0"),
            load_xclbin_file: sym!(b"xrtDeviceLoadXclbinFile\0"),
            xclbin_uuid: sym!(b"xrtDeviceGetXclbinUUID\0"),
            kernel_open: sym!(b"xrtPLKernelOpen\0"),
            kernel_close: sym!(b"xrtKernelClose\0"),
            arg_group_id: sym!(b"xrtKernelArgGroupId\0"),
            bo_alloc: sym!(b"xrtBOAlloc\0"),
            bo_free: sym!(b"xrtBOFree\0"),
            bo_map: sym!(b"xrtBOMap\0"),
            bo_sync: sym!(b"xrtBOSync\0"),
            run_open: sym!(b"xrtRunOpen\0"),
            run_set_arg: sym!(b"xrtRunSetArg\0"),
            run_start: sym!(b"xrtRunStart\0"),
            run_wait: sym!(b"xrtRunWait\0"),
            run_close: sym!(b"xrtRunClose\0"),
        };
        // SAFETY: the emulator's marker returns a static NUL-terminated string.
        let emulator = unsafe { lib.get::<unsafe extern "C" fn() -> *const c_char>(b"hillsideXrtEmulator\0") }
            .ok()
            .map(|f| unsafe { std::ffi::CStr::from_ptr(f()) }.to_string_lossy().into_owned());
        Ok(Arc::new(Self { api, path: path.to_path_buf(), emulator, _lib: lib }))
    }

    /// What the library is: the emulator's description, or XRT's version.
    pub fn version(&self) -> String {
        self.emulator.clone().unwrap_or_else(|| file_version(&self.path))
    }

    /// Opens card `index`; `None` when there is no such card.
    pub fn open_device(self: &Arc<Self>, index: u32) -> Option<Device> {
        // SAFETY: plain C call; a null handle means no device.
        let handle = unsafe { (self.api.device_open)(index) };
        (!handle.is_null()).then(|| Device { xrt: self.clone(), handle })
    }
}

pub struct Device {
    xrt: Arc<Xrt>,
    handle: Handle,
}

impl Device {
    /// Loads an xclbin and returns its UUID.
    pub fn load_xclbin(&self, path: &Path) -> Result<[u8; 16]> {
        let c_path = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| XrtError::NulByte { what: "the xclbin path" })?;
        // SAFETY: valid handle and NUL-terminated path.
        check(&format!("loading {}", path.display()), unsafe {
            (self.xrt.api.load_xclbin_file)(self.handle, c_path.as_ptr())
        })?;
        let mut uuid = [0u8; 16];
        // SAFETY: `uuid` has the 16 bytes xuid_t needs.
        check("xrtDeviceGetXclbinUUID", unsafe { (self.xrt.api.xclbin_uuid)(self.handle, uuid.as_mut_ptr()) })?;
        Ok(uuid)
    }

    pub fn open_kernel(&self, uuid: &[u8; 16], name: &str) -> Result<Kernel> {
        let c_name = CString::new(name).map_err(|_| XrtError::NulByte { what: "the kernel name" })?;
        // SAFETY: valid handle, 16-byte uuid, NUL-terminated name.
        let handle = unsafe { (self.xrt.api.kernel_open)(self.handle, uuid.as_ptr(), c_name.as_ptr()) };
        if handle.is_null() {
            return Err(XrtError::NoKernel { name: name.to_string(), source: errno() }.into());
        }
        Ok(Kernel { xrt: self.xrt.clone(), handle })
    }

    /// A buffer of `bytes` in memory bank `group`; `p2p` makes it reachable by the SSD.
    pub fn alloc(&self, bytes: usize, group: i32, p2p: bool) -> Result<Buffer> {
        let flags = if p2p { BO_FLAGS_P2P } else { BO_FLAGS_NONE };
        // SAFETY: valid device handle.
        let handle = unsafe { (self.xrt.api.bo_alloc)(self.handle, bytes, flags, group as u32) };
        if handle.is_null() {
            return Err(XrtError::Allocate { bytes, p2p, source: errno() }.into());
        }
        // SAFETY: valid buffer handle; the mapping lives as long as the buffer.
        let map = unsafe { (self.xrt.api.bo_map)(handle) };
        if map.is_null() {
            // SAFETY: the handle came from bo_alloc and is freed once.
            unsafe { (self.xrt.api.bo_free)(handle) };
            return Err(XrtError::Map { bytes, source: errno() }.into());
        }
        Ok(Buffer { xrt: self.xrt.clone(), handle, map: map.cast(), bytes })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: opened by device_open, closed once.
        unsafe { (self.xrt.api.device_close)(self.handle) };
    }
}

pub struct Kernel {
    xrt: Arc<Xrt>,
    handle: Handle,
}

/// One kernel argument.
pub enum Arg<'a> {
    Buffer(&'a Buffer),
    U32(u32),
}

impl Kernel {
    /// The memory bank argument `index` (a buffer) must be allocated in.
    pub fn group_id(&self, index: i32) -> Result<i32> {
        // SAFETY: valid kernel handle.
        let group = unsafe { (self.xrt.api.arg_group_id)(self.handle, index) };
        if group < 0 {
            return Err(XrtError::NoMemoryBank { index, source: errno() }.into());
        }
        Ok(group)
    }

    /// Starts one run of the kernel with `args`. The buffers must stay untouched until it is
    /// waited for.
    pub fn start(&self, args: &[Arg<'_>]) -> Result<Run> {
        // SAFETY: valid kernel handle.
        let handle = unsafe { (self.xrt.api.run_open)(self.handle) };
        if handle.is_null() {
            return Err(XrtError::Call { call: "xrtRunOpen".into(), source: errno() }.into());
        }
        // From here dropping `run` closes it.
        let run = Run { xrt: self.xrt.clone(), handle };
        for (i, arg) in args.iter().enumerate() {
            // SAFETY: the argument types are XRT's: a buffer handle or a promoted uint32.
            let rc = unsafe {
                match arg {
                    Arg::Buffer(b) => (self.xrt.api.run_set_arg)(handle, i as c_int, b.handle),
                    Arg::U32(v) => (self.xrt.api.run_set_arg)(handle, i as c_int, *v as c_uint),
                }
            };
            check(&format!("setting kernel argument {i}"), rc)?;
        }
        // SAFETY: a fully argumented run.
        check("xrtRunStart", unsafe { (self.xrt.api.run_start)(handle) })?;
        Ok(run)
    }
}

/// A started kernel run.
pub struct Run {
    xrt: Arc<Xrt>,
    handle: Handle,
}

impl Run {
    pub fn wait(self) -> Result<()> {
        // SAFETY: a started run.
        match unsafe { (self.xrt.api.run_wait)(self.handle) } {
            RUN_COMPLETED => Ok(()),
            state => Err(XrtError::RunNotCompleted(state).into()),
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // SAFETY: opened by run_open, closed once (XRT waits for a run still going).
        unsafe { (self.xrt.api.run_close)(self.handle) };
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: opened by kernel_open, closed once.
        unsafe { (self.xrt.api.kernel_close)(self.handle) };
    }
}

/// A device buffer and its host mapping (for a P2P buffer, a window onto the card's memory).
pub struct Buffer {
    xrt: Arc<Xrt>,
    handle: Handle,
    map: *mut u8,
    bytes: usize,
}

// SAFETY: XRT buffer handles may be used from any thread; the mapping is owned by this value
// and reached only through &self / &mut self.
unsafe impl Send for Buffer {}
unsafe impl Send for Kernel {}
unsafe impl Send for Device {}
// SAFETY: the library's function table is immutable after loading.
unsafe impl Send for Xrt {}
unsafe impl Sync for Xrt {}

impl Buffer {
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: XRT mapped `bytes` bytes at `map` for the buffer's lifetime; &mut self is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.map, self.bytes) }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: as above, shared.
        unsafe { std::slice::from_raw_parts(self.map, self.bytes) }
    }

    pub fn sync_to_device(&self) -> Result<()> {
        // SAFETY: valid buffer handle, whole-buffer range.
        check("xrtBOSync to the device", unsafe { (self.xrt.api.bo_sync)(self.handle, SYNC_TO_DEVICE, self.bytes, 0) })
    }

    pub fn sync_from_device(&self) -> Result<()> {
        // SAFETY: valid buffer handle, whole-buffer range.
        check("xrtBOSync from the device", unsafe {
            (self.xrt.api.bo_sync)(self.handle, SYNC_FROM_DEVICE, self.bytes, 0)
        })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated by bo_alloc, freed once.
        unsafe { (self.xrt.api.bo_free)(self.handle) };
    }
}
