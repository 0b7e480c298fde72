//! A GGUF file's header: its metadata and where each tensor lies, read by us rather than by
//! candle's parser, which refuses a whole file for one tensor type it does not know (gpt-oss's
//! MXFP4 experts, IQ4_XS). Every count and length is checked against the file's size before
//! anything is allocated for it: a model file is as untrusted as any dropped document.

use candle_core::quantized::gguf_file::Value;
use std::collections::HashMap;
use std::io::{self, Read, Seek, SeekFrom};

/// The ggml tensor types, as numbered in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq4Nl,
    Iq4Xs,
    Mxfp4,
    /// A type this reader can size but not read (the 1- to 3-bit IQ formats, ternary ones, …):
    /// a model that has one is refused with its name.
    Other(&'static str),
}

impl TensorType {
    /// The type numbered `id`, with its block's values and bytes; `None` for an unknown number.
    fn from_id(id: u32) -> Option<(Self, usize, usize)> {
        use TensorType::*;
        Some(match id {
            0 => (F32, 1, 4),
            1 => (F16, 1, 2),
            2 => (Q4_0, 32, 18),
            3 => (Q4_1, 32, 20),
            6 => (Q5_0, 32, 22),
            7 => (Q5_1, 32, 24),
            8 => (Q8_0, 32, 34),
            9 => (Q8_1, 32, 36),
            10 => (Q2K, 256, 84),
            11 => (Q3K, 256, 110),
            12 => (Q4K, 256, 144),
            13 => (Q5K, 256, 176),
            14 => (Q6K, 256, 210),
            15 => (Q8K, 256, 292),
            16 => (Other("IQ2_XXS"), 256, 66),
            17 => (Other("IQ2_XS"), 256, 74),
            18 => (Other("IQ3_XXS"), 256, 98),
            19 => (Other("IQ1_S"), 256, 50),
            20 => (Iq4Nl, 32, 18),
            21 => (Other("IQ3_S"), 256, 110),
            22 => (Other("IQ2_S"), 256, 82),
            23 => (Iq4Xs, 256, 136),
            24 => (Other("I8"), 1, 1),
            25 => (Other("I16"), 1, 2),
            26 => (Other("I32"), 1, 4),
            27 => (Other("I64"), 1, 8),
            28 => (Other("F64"), 1, 8),
            29 => (Other("IQ1_M"), 256, 56),
            30 => (Bf16, 1, 2),
            34 => (Other("TQ1_0"), 256, 54),
            35 => (Other("TQ2_0"), 256, 66),
            39 => (Mxfp4, 32, 17),
            _ => return None,
        })
    }
}

/// Where one tensor lies and what it holds.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub kind: TensorType,
    /// Outermost first, as candle and the kernels count them: a matrix is `[rows, cols]`.
    pub dims: Vec<usize>,
    /// From the start of the file.
    pub offset_bytes: u64,
    pub size_bytes: usize,
}

#[derive(Debug)]
pub struct GgufHeader {
    pub metadata: HashMap<String, Value>,
    pub tensors: HashMap<String, TensorInfo>,
}

/// A string longer than this is no key, token or chat template but a broken file.
const MAX_STRING_BYTES: u64 = 64 << 20;
/// Arrays of arrays are legal; deeper nesting than this is not a model's.
const MAX_ARRAY_DEPTH: usize = 3;
/// ggml's largest tensor rank.
const MAX_DIMS: u32 = 4;

fn invalid(reason: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, reason.into())
}

/// Reads a header from the start of `file`; an error says what is wrong with it.
pub fn read(file: &mut (impl Read + Seek)) -> io::Result<GgufHeader> {
    let file_bytes = file.seek(SeekFrom::End(0))?;
    file.seek(SeekFrom::Start(0))?;
    let mut r = Fields { file, left: file_bytes };
    if file_bytes < 4 || &r.bytes::<4>()? != b"GGUF" {
        return Err(invalid("not a GGUF file (the first bytes are not 'GGUF')"));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(invalid(format!("GGUF version {version} (versions 2 and 3 are read)")));
    }
    let (tensor_count, metadata_count) = (r.u64()?, r.u64()?);
    // Each entry takes more than 8 bytes of the file, so larger counts cannot be true.
    if tensor_count.max(metadata_count) > r.left / 8 {
        return Err(invalid(format!(
            "{tensor_count} tensors and {metadata_count} metadata keys in a file of {file_bytes} bytes"
        )));
    }
    let mut metadata = HashMap::with_capacity(metadata_count as usize);
    for _ in 0..metadata_count {
        let key = r.string()?;
        let kind = r.u32()?;
        let value = r.value(kind, 0).map_err(|e| invalid(format!("metadata '{key}': {e}")))?;
        metadata.insert(key, value);
    }
    let mut infos = Vec::with_capacity(tensor_count as usize);
    for _ in 0..tensor_count {
        let name = r.string()?;
        let rank = r.u32()?;
        if rank == 0 || rank > MAX_DIMS {
            return Err(invalid(format!("tensor '{name}' has {rank} dimensions")));
        }
        let mut dims = (0..rank).map(|_| r.u64()).collect::<io::Result<Vec<u64>>>()?;
        dims.reverse();
        let id = r.u32()?;
        let offset = r.u64()?;
        infos.push((name, dims, id, offset));
    }
    let alignment = match metadata.get("general.alignment") {
        Some(v) => v.to_u32().map_err(|e| invalid(format!("general.alignment: {e}")))? as u64,
        None => 32,
    };
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(invalid(format!("general.alignment is {alignment}, not a power of two")));
    }
    let data_start = (file_bytes - r.left).div_ceil(alignment) * alignment;
    let mut tensors = HashMap::with_capacity(infos.len());
    for (name, dims, id, offset) in infos {
        let info = tensor_info(&name, &dims, id, offset, data_start, file_bytes)?;
        if tensors.insert(name.clone(), info).is_some() {
            return Err(invalid(format!("tensor '{name}' is listed twice")));
        }
    }
    Ok(GgufHeader { metadata, tensors })
}

fn tensor_info(
    name: &str,
    dims: &[u64],
    id: u32,
    offset: u64,
    data_start: u64,
    file_bytes: u64,
) -> io::Result<TensorInfo> {
    let (kind, block_values, block_bytes) =
        TensorType::from_id(id).ok_or_else(|| invalid(format!("tensor '{name}' has the unknown type {id}")))?;
    let elements = dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    let inner = dims.last().copied().unwrap_or(0);
    let size = elements
        .filter(|_| inner % block_values as u64 == 0)
        .and_then(|n| (n / block_values as u64).checked_mul(block_bytes as u64));
    let Some(size) = size else {
        return Err(invalid(format!("tensor '{name}' has the impossible shape {dims:?} for its type")));
    };
    let start = data_start.checked_add(offset);
    match start.and_then(|s| s.checked_add(size)) {
        Some(end) if end <= file_bytes => Ok(TensorInfo {
            kind,
            dims: dims.iter().map(|&d| d as usize).collect(),
            offset_bytes: data_start + offset,
            size_bytes: size as usize,
        }),
        _ => Err(invalid(format!(
            "tensor '{name}' lies past the end of the file ({file_bytes} bytes): the file is truncated"
        ))),
    }
}

/// The header's fields in order, with the bytes the file has left after them.
struct Fields<'a, R> {
    file: &'a mut R,
    left: u64,
}

impl<R: Read> Fields<'_, R> {
    fn bytes<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        if self.left < N as u64 {
            return Err(invalid("the header ends early: the file is truncated"));
        }
        let mut b = [0u8; N];
        self.file.read_exact(&mut b)?;
        self.left -= N as u64;
        Ok(b)
    }

    fn u32(&mut self) -> io::Result<u32> {
        self.bytes().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> io::Result<u64> {
        self.bytes().map(u64::from_le_bytes)
    }

    fn string(&mut self) -> io::Result<String> {
        let len = self.u64()?;
        if len > MAX_STRING_BYTES || len > self.left {
            return Err(invalid(format!("a string of {len} bytes with {} left in the file", self.left)));
        }
        let mut bytes = vec![0u8; len as usize];
        self.file.read_exact(&mut bytes)?;
        self.left -= len;
        String::from_utf8(bytes).map_err(|_| invalid("a string that is not UTF-8"))
    }

    fn value(&mut self, kind: u32, depth: usize) -> io::Result<Value> {
        Ok(match kind {
            0 => Value::U8(self.bytes::<1>()?[0]),
            1 => Value::I8(self.bytes::<1>()?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.bytes()?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.bytes()?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes()?)),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::String(self.string()?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(invalid("arrays nested too deep"));
                }
                let item = self.u32()?;
                let count = self.u64()?;
                // Every item takes at least a byte of the file.
                if count > self.left {
                    return Err(invalid(format!(
                        "an array of {count} items with {} bytes left in the file",
                        self.left
                    )));
                }
                let items = (0..count).map(|_| self.value(item, depth + 1)).collect::<io::Result<Vec<_>>>()?;
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.bytes()?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes()?)),
            other => return Err(invalid(format!("unknown value type {other}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    /// A version-3 header with one string key and one F32 tensor of `dims` (ggml order) at
    /// offset 0, followed by `data_bytes` bytes of data.
    fn file(dims: &[u64], kind: u32, data_bytes: usize) -> Vec<u8> {
        let mut f = b"GGUF".to_vec();
        f.extend(3u32.to_le_bytes());
        f.extend(1u64.to_le_bytes());
        f.extend(1u64.to_le_bytes());
        string(&mut f, "general.architecture");
        f.extend(8u32.to_le_bytes());
        string(&mut f, "llama");
        string(&mut f, "w");
        f.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            f.extend(d.to_le_bytes());
        }
        f.extend(kind.to_le_bytes());
        f.extend(0u64.to_le_bytes());
        f.resize(f.len().div_ceil(32) * 32 + data_bytes, 0);
        f
    }

    #[test]
    fn a_header_gives_metadata_and_tensors_outermost_dimension_first() {
        let h = read(&mut Cursor::new(file(&[64, 3], 39, 3 * 2 * 17))).unwrap();
        assert_eq!(h.metadata["general.architecture"].to_string().unwrap(), "llama");
        let w = &h.tensors["w"];
        assert_eq!((w.kind, w.dims.as_slice(), w.size_bytes), (TensorType::Mxfp4, &[3usize, 64][..], 102));
    }

    #[test]
    fn broken_headers_are_refused_with_the_reason() {
        let cases: [(Vec<u8>, &str); 7] = [
            (file(&[64, 3], 39, 100), "truncated"),
            (file(&[63, 3], 39, 1000), "impossible shape"),
            (file(&[u64::MAX, u64::MAX], 0, 0), "impossible shape"),
            (file(&[64], 31, 1000), "unknown type 31"),
            (b"GGUF\x03\0\0\0\xff\xff\xff\xff\xff\xff\xff\x7f\0\0\0\0\0\0\0\0".to_vec(), "tensors"),
            (b"GGML".to_vec(), "not a GGUF"),
            (Vec::new(), "not a GGUF"),
        ];
        for (bytes, reason) in cases {
            let e = read(&mut Cursor::new(bytes)).unwrap_err().to_string();
            assert!(e.contains(reason), "{e} (wanted '{reason}')");
        }
        // A string that claims more bytes than the file has left.
        let mut f = file(&[32], 0, 128);
        f[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = read(&mut Cursor::new(f)).unwrap_err().to_string();
        assert!(e.contains("a string of"), "{e}");
        // An array that claims more items than the file has bytes.
        let mut f = b"GGUF\x03\0\0\0".to_vec();
        f.extend(0u64.to_le_bytes());
        f.extend(1u64.to_le_bytes());
        string(&mut f, "k");
        f.extend(9u32.to_le_bytes());
        f.extend(0u32.to_le_bytes());
        f.extend((1u64 << 40).to_le_bytes());
        let e = read(&mut Cursor::new(f)).unwrap_err().to_string();
        assert!(e.contains("an array of"), "{e}");
    }
}
