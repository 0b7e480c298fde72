//! A sequence's K/V for a prompt prefix, saved to a file and replayed into a new store of any
//! kind: how a document's cache outlives the request, and the process, that computed it.
//!
//! The file is a header and then the prefix in chunks of [`CHUNK_TOKENS`] tokens, each chunk
//! one record per layer: K rows then V rows (f16, token-major, RoPE applied to K: exactly what
//! `KvStore::append` takes, at the precision every store keeps) and a CRC32 of both. Loading
//! replays the chunks as a prefill would (every layer's rows, then a commit), so the store
//! spills to its cold pool as it goes; a record that fails its checksum, a short file or a
//! header that does not match stops the replay with an error, and the caller drops the store:
//! damaged K/V is never attended to. A save writes a temporary file and renames it into place,
//! so a crash leaves the old file or none, never half of one.

use crate::error::{Error, KvMisuse, Result};
use crate::kernels::attention::k_tile_index;
use crate::kv::{KvShape, KvStore, Selection, KV_TILE};
use half::f16;
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Tokens per chunk of records (the replay appends this many at a time).
pub const CHUNK_TOKENS: usize = 256;
const MAGIC: &[u8; 8] = b"HSKVSNP1";
/// Magic, four u32 (layers, KV heads, head dim, tokens), the 32-byte tag and the header's CRC32.
const HEADER_BYTES: usize = 8 + 4 * 4 + 32 + 4;

/// Suffix of a snapshot being written; such a file is never read (a crash may leave one).
pub const PARTIAL_SUFFIX: &str = ".partial";

fn damaged(path: &Path, why: impl std::fmt::Display) -> Error {
    tracing::warn!(path = %path.display(), "KV snapshot unusable: {why}");
    Error::KvSnapshot(why.to_string())
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    tracing::error!(path = %path.display(), error = %e, "KV snapshot: {what}");
    Error::ColdIo { what: format!("KV snapshot {what}"), source: e }
}

fn header(shape: KvShape, tokens: usize, tag: &[u8; 32]) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    for n in [shape.n_layers, shape.n_kv_heads, shape.head_dim, tokens] {
        h.extend_from_slice(&(n as u32).to_le_bytes());
    }
    h.extend_from_slice(tag);
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

/// Bytes a snapshot of `tokens` tokens takes.
pub fn file_bytes(shape: KvShape, tokens: usize) -> u64 {
    (HEADER_BYTES
        + tokens * shape.n_layers * 2 * shape.kv_dim() * 2
        + tokens.div_ceil(CHUNK_TOKENS) * shape.n_layers * 4) as u64
}

/// Writes the first `tokens` tokens of `kv` to `path`, marked with `tag` (what the caller keys
/// it by: a load with another tag refuses it). Returns the file's size.
pub fn save(kv: &mut dyn KvStore, tokens: usize, tag: &[u8; 32], path: &Path) -> Result<u64> {
    let shape = kv.shape();
    if tokens > kv.len_tokens() {
        return Err(KvMisuse::SnapshotBeyondStore { tokens, held: kv.len_tokens() }.into());
    }
    let partial = partial_path(path);
    let _ = std::fs::remove_file(&partial);
    let file = crate::private_files::options()
        .write(true)
        .create_new(true)
        .open(&partial)
        .map_err(|e| io_error("create failed", path, e))?;
    // A layer at a time (a store gathers a layer at a time), each chunk's record written at
    // its place in the file, so no more than one layer's rows are held.
    let written = (|| -> Result<()> {
        let write_at = |bytes: &[u8], offset: usize| {
            file.write_all_at(bytes, offset as u64).map_err(|e| io_error("write failed", path, e))
        };
        write_at(&header(shape, tokens, tag), 0)?;
        let kv_dim = shape.kv_dim();
        let record_bytes = |n: usize| 2 * n * kv_dim * 2 + 4;
        for layer in 0..shape.n_layers {
            let (k, v) = layer_rows(kv, layer, tokens)?;
            for start in (0..tokens).step_by(CHUNK_TOKENS) {
                let n = CHUNK_TOKENS.min(tokens - start);
                let rows = start * kv_dim..(start + n) * kv_dim;
                let mut record = Vec::with_capacity(record_bytes(n));
                record.extend_from_slice(as_bytes(&k[rows.clone()]));
                record.extend_from_slice(as_bytes(&v[rows]));
                record.extend_from_slice(&crc32fast::hash(&record).to_le_bytes());
                let chunk = start / CHUNK_TOKENS;
                write_at(
                    &record,
                    HEADER_BYTES + chunk * shape.n_layers * record_bytes(CHUNK_TOKENS) + layer * record_bytes(n),
                )?;
            }
        }
        file.sync_all().map_err(|e| io_error("write failed", path, e))?;
        std::fs::rename(&partial, path).map_err(|e| io_error("rename failed", path, e))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written?;
    Ok(file_bytes(shape, tokens))
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(PARTIAL_SUFFIX);
    PathBuf::from(name)
}

/// Replays the snapshot at `path` into the empty store `kv`; returns the tokens it holds. On an
/// error `kv` holds part of them: drop it.
pub fn load(path: &Path, tag: &[u8; 32], kv: &mut dyn KvStore) -> Result<usize> {
    let shape = kv.shape();
    if kv.len_tokens() != 0 {
        return Err(KvMisuse::SnapshotIntoNonEmpty.into());
    }
    let file = File::open(path).map_err(|e| io_error("open failed", path, e))?;
    let mut input = BufReader::with_capacity(1 << 20, file);
    let mut head = [0u8; HEADER_BYTES];
    read_or_damaged(&mut input, &mut head, path)?;
    let field = |i: usize| u32::from_le_bytes(head[8 + 4 * i..][..4].try_into().unwrap()) as usize;
    let tokens = field(3);
    if head[..HEADER_BYTES - 4] != header(shape, tokens, tag)[..HEADER_BYTES - 4] {
        return Err(damaged(path, "it was written for another model, shape or prompt, or its header is damaged"));
    }
    if tokens > shape.max_tokens {
        return Err(damaged(path, format!("it holds {tokens} tokens, more than the context of {}", shape.max_tokens)));
    }
    let kv_dim = shape.kv_dim();
    let mut record = Vec::new();
    let (mut k, mut v) = (Vec::new(), Vec::new());
    for start in (0..tokens).step_by(CHUNK_TOKENS) {
        let n = CHUNK_TOKENS.min(tokens - start);
        let values = n * kv_dim;
        for layer in 0..shape.n_layers {
            record.resize(2 * values * 2 + 4, 0);
            read_or_damaged(&mut input, &mut record, path)?;
            let (rows, crc) = record.split_at(4 * values);
            if crc32fast::hash(rows) != u32::from_le_bytes(crc.try_into().unwrap()) {
                return Err(damaged(path, format!("layer {layer}, tokens {start}..{} fail their checksum", start + n)));
            }
            k.clear();
            v.clear();
            k.extend(rows[..2 * values].chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()));
            v.extend(rows[2 * values..].chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()));
            kv.append(layer, &k, &v)?;
        }
        kv.commit(n)?;
    }
    if input.read(&mut [0u8; 1]).map_err(|e| io_error("read failed", path, e))? != 0 {
        return Err(damaged(path, "it is longer than its header says"));
    }
    Ok(tokens)
}

fn read_or_damaged(input: &mut impl Read, buf: &mut [u8], path: &Path) -> Result<()> {
    input.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => damaged(path, "it is shorter than its header says"),
        _ => io_error("read failed", path, e),
    })
}

/// Layer `layer`'s K and V rows of tokens `0..tokens` (f16 bits, token-major), gathered from
/// the store as a prompt would see them.
fn layer_rows(kv: &mut dyn KvStore, layer: usize, tokens: usize) -> Result<(Vec<u16>, Vec<u16>)> {
    let shape = kv.shape();
    let (hd, kv_dim) = (shape.head_dim, shape.kv_dim());
    let (mut k, mut v) = (vec![0u16; tokens * kv_dim], vec![0u16; tokens * kv_dim]);
    // Each planned view of a whole-cache selection, whole (not in spans, which would each name
    // positions of their own).
    for part in kv.parts(&Selection::All, 0) {
        let heads = part.heads;
        let view = kv.gather(layer, &Selection::All, heads.clone())?;
        if view.n_tokens < tokens || view.positions.is_some() || view.head_stride_tokens % KV_TILE != 0 {
            // A store that dropped tokens (`drop`) has no whole prefix to keep.
            return Err(KvMisuse::NoWholePrefix { tokens, in_view: view.n_tokens }.into());
        }
        for (at, head) in heads.enumerate() {
            let (head_k, head_v) =
                (&view.k[at * view.head_stride_tokens * hd..], &view.v[at * view.head_stride_tokens * hd..]);
            for t in 0..tokens {
                let row = t * kv_dim + head * hd;
                for d in 0..hd {
                    k[row + d] = head_k[k_tile_index(t, d, hd)].to_bits();
                }
                for (dst, src) in v[row..][..hd].iter_mut().zip(&head_v[t * hd..][..hd]) {
                    *dst = src.to_bits();
                }
            }
        }
    }
    Ok((k, v))
}

fn as_bytes(words: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding and a stricter alignment than u8; the length doubles.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), words.len() * 2) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::FullKvStore;

    fn shape() -> KvShape {
        KvShape { n_layers: 2, n_kv_heads: 2, head_dim: 4, max_tokens: 600 }
    }

    /// A store holding `n` tokens of distinct values (exact in f16).
    fn filled(n: usize) -> FullKvStore {
        let mut kv = FullKvStore::new(shape());
        let rows =
            |layer: usize, base: f32| (0..n * 8).map(|i| base + (layer * 1000 + i) as f32 / 8.0).collect::<Vec<f32>>();
        for layer in 0..2 {
            kv.append(layer, &rows(layer, 0.0), &rows(layer, -900.0)).unwrap();
        }
        kv.commit(n).unwrap();
        kv
    }

    fn rows_of(kv: &mut dyn KvStore) -> Vec<(Vec<u16>, Vec<u16>)> {
        let n = kv.len_tokens();
        (0..2).map(|l| layer_rows(kv, l, n).unwrap()).collect()
    }

    #[test]
    fn a_saved_prefix_replays_into_an_equal_store_and_damage_is_refused() {
        let scratch = tempfile::Builder::new().prefix("hillside-snapshot-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let path = dir.join("doc.kv");
        let tag = [7u8; 32];
        let mut source = filled(300); // two chunks, the second short
        let bytes = save(&mut source, 290, &tag, &path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), bytes);
        assert!(!partial_path(&path).exists());

        let mut loaded = FullKvStore::new(shape());
        assert_eq!(load(&path, &tag, &mut loaded).unwrap(), 290);
        source.truncate(290);
        assert_eq!(rows_of(&mut loaded), rows_of(&mut source), "every row comes back bit for bit");

        let refused =
            |path: &Path, tag: &[u8; 32]| load(path, tag, &mut FullKvStore::new(shape())).unwrap_err().to_string();
        assert!(refused(&path, &[8u8; 32]).contains("another model, shape or prompt"));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_BYTES + 100] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(
            refused(&path, &tag).contains("layer 0, tokens 0..256 fail their checksum"),
            "{}",
            refused(&path, &tag)
        );
        bytes[HEADER_BYTES + 100] ^= 1;
        std::fs::write(&path, &bytes[..bytes.len() - 9]).unwrap();
        assert!(refused(&path, &tag).contains("shorter than its header says"));
    }
}
