//! A copy of a grouped-query-attention GGUF model as multi-head attention: each KV head's K and
//! V projection rows repeated for every query head that shares it. The copy computes what the
//! original does, with a KV cache as wide as its queries: the shape HILOS's X-cache pays off for.
//! The tests use it to run the X-cache on real weights; `examples/mha_from_gqa.rs` writes one
//! for the benchmarks.

use candle_core::quantized::ggml_file::qtensor_from_ggml;
use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::QTensor;
use candle_core::Device;
use std::error::Error;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

/// Writes the multi-head copy of `input` to `output`; returns the KV heads before and after.
pub fn write_mha_copy(input: &Path, output: &Path) -> Result<(usize, usize), Box<dyn Error>> {
    let mut reader = BufReader::new(File::open(input)?);
    let content = gguf_file::Content::read(&mut reader)?;
    let arch = content.metadata.get("general.architecture").ok_or("no general.architecture")?.to_string()?.clone();
    let count = |key: &str| -> Result<usize, Box<dyn Error>> {
        Ok(content.metadata.get(&format!("{arch}.{key}")).ok_or(format!("no {arch}.{key}"))?.to_u32()? as usize)
    };
    let (heads, kv_heads) = (count("attention.head_count")?, count("attention.head_count_kv")?);
    let group = heads / kv_heads;

    let mut tensors = Vec::new();
    for name in content.tensor_infos.keys() {
        let tensor = content.tensor(&mut reader, name, &Device::Cpu)?;
        let kv_part =
            [".attn_k.weight", ".attn_v.weight", ".attn_k.bias", ".attn_v.bias"].iter().any(|s| name.ends_with(s));
        tensors
            .push((name.clone(), if kv_part && group > 1 { repeat_heads(&tensor, kv_heads, group)? } else { tensor }));
    }
    let kv_key = format!("{arch}.attention.head_count_kv");
    let metadata: Vec<(&str, Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), if *k == kv_key { Value::U32(heads as u32) } else { v.clone() }))
        .collect();
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    gguf_file::write(&mut File::create(output)?, &metadata, &tensors)?;
    Ok((kv_heads, heads))
}

/// The rows of each of `kv_heads` heads (a projection's rows, or a bias's values), `group`
/// times over. Quantized blocks never straddle rows, so the bytes are copied as they are.
fn repeat_heads(tensor: &QTensor, kv_heads: usize, group: usize) -> candle_core::Result<QTensor> {
    let raw = tensor.data()?;
    let mut dims = tensor.shape().dims().to_vec();
    let head_bytes = raw.len() / kv_heads;
    let mut out = Vec::with_capacity(raw.len() * group);
    for head in raw.chunks_exact(head_bytes) {
        for _ in 0..group {
            out.extend_from_slice(head);
        }
    }
    dims[0] *= group;
    qtensor_from_ggml(tensor.dtype(), &out, dims, &Device::Cpu)
}
