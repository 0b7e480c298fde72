//! The desktop app's binary on a virtual X display (Xvfb, started here): its window appears and
//! shows the UI (a screenshot that is not blank), the endpoint it started answers (on another
//! port, with a notice, when the configured one is taken), and SIGTERM closes it cleanly with a
//! tiered store's generation under way: exit status 0 and no cold-pool file left.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Catches a hang only: the model loads and the page renders in seconds.
const PATIENCE: Duration = Duration::from_secs(180);

struct Display {
    name: String,
    xvfb: Child,
}

impl Display {
    fn start() -> Self {
        let number = 90 + std::process::id() % 400;
        let name = format!(":{number}");
        let xvfb = Command::new("Xvfb")
            .args([name.as_str(), "-screen", "0", "1280x800x24", "-nolisten", "tcp"])
            .stderr(Stdio::null())
            .spawn()
            .expect("Xvfb (apt install xvfb)");
        let socket = PathBuf::from(format!("/tmp/.X11-unix/X{number}"));
        wait_for("Xvfb's socket", || socket.exists().then_some(()));
        Self { name, xvfb }
    }

    fn run(&self, program: &str, args: &[&str]) -> Vec<u8> {
        let out = Command::new(program)
            .args(args)
            .env("DISPLAY", &self.name)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e} (apt install x11-utils x11-apps)"));
        out.stdout
    }

    fn colors(&self) -> HashSet<[u8; 3]> {
        colors_of(&self.run("xwd", &["-root", "-silent"]))
    }
}

impl Drop for Display {
    fn drop(&mut self) {
        let _ = self.xvfb.kill();
        let _ = self.xvfb.wait();
    }
}

/// The colors (RGB) of an XWD image, the X window dump `xwd` writes: a header of big-endian
/// 32-bit words, a color table, then rows of pixels in the byte order the header names.
fn colors_of(xwd: &[u8]) -> HashSet<[u8; 3]> {
    let word = |i: usize| u32::from_be_bytes(xwd[i * 4..i * 4 + 4].try_into().unwrap()) as usize;
    let (header, width, height, least_first, bits_per_pixel, bytes_per_line, table) =
        (word(0), word(4), word(5), word(7) == 0, word(11), word(12), word(19));
    let pixel_bytes = bits_per_pixel / 8;
    let mut seen = HashSet::new();
    for row in xwd[header + table * 12..].chunks(bytes_per_line).take(height) {
        for p in row[..width * pixel_bytes].chunks_exact(pixel_bytes) {
            let rgb = if least_first {
                [p[2], p[1], p[0]]
            } else {
                [p[pixel_bytes - 3], p[pixel_bytes - 2], p[pixel_bytes - 1]]
            };
            seen.insert(rgb);
        }
    }
    seen
}

/// The app under test, killed if the test fails before it exits.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for<T>(what: &str, mut ready: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = ready() {
            return v;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Cold-pool files (the folder also keeps the tiered store's disk profile).
fn cold_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map_or(0, |d| d.flatten().filter(|e| e.path().extension().is_some_and(|x| x == "cold")).count())
}

#[test]
fn the_window_shows_the_ui_and_closes_cleanly() {
    let root_scratch = tempfile::Builder::new().prefix("hillside-desktop-window-").tempdir().unwrap();
    let root = root_scratch.path().to_path_buf();
    let cold = root.join("cold");
    let config = root.join("config.toml");
    std::fs::write(&config, format!("context = 2048\n\n[kv]\nstore = \"tiered\"\ncold_dir = \"{}\"\n", cold.display()))
        .unwrap();
    // The configured port is taken: the app must take another and say so.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();

    let display = Display::start();
    let mut app = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_hillside-desktop"))
            .args(["--port", &port, "--documents-dir", root.join("data").to_str().unwrap()])
            .env("DISPLAY", &display.name)
            .env("HILLSIDE_CONFIG", &config)
            // No GPU under Xvfb: WebKit draws in software.
            .env("WEBKIT_DISABLE_DMABUF_RENDERER", "1")
            .env("LIBGL_ALWAYS_SOFTWARE", "1")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (lines_tx, lines) = mpsc::channel();
    let stdout = app.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        BufReader::new(stdout).lines().map_while(Result::ok).for_each(|l| drop(lines_tx.send(l)))
    });
    let mut said = Vec::new();
    let url = wait_for("the app's address", || {
        said.extend(lines.try_iter());
        said.iter().find_map(|l| l.strip_prefix("hillside-desktop: serving on ").map(str::to_string))
    });
    said.extend(lines.try_iter());
    assert!(!url.contains(&format!(":{port}/")), "{url}");
    assert!(said.iter().any(|l| l.contains(&format!("Port {port} is taken"))), "{said:?}");

    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(PATIENCE)).build().into();
    let models: serde_json::Value =
        agent.get(&format!("{url}v1/models")).call().unwrap().body_mut().read_json().unwrap();
    assert_eq!(models["data"][0]["id"], "smollm2-135m-instruct", "{models}");

    wait_for("the Hillside window", || {
        String::from_utf8_lossy(&display.run("xwininfo", &["-root", "-tree"])).contains("\"Hillside\"").then_some(())
    });
    // The page is drawn: many colors (text, borders), among them the UI's accent (the New chat
    // button, light or dark theme), which neither a blank window nor WebKit's error page shows.
    let accents = [[0x2f, 0x6f, 0x4f], [0x5b, 0xb2, 0x87]];
    let colors = wait_for("the UI to be drawn", || {
        Some(display.colors()).filter(|c| c.len() > 40 && accents.iter().any(|a| c.contains(a)))
    });
    assert!(colors.len() > 40);

    // A generation under way, with its cold-pool file, when the app is told to stop.
    let streaming = {
        let (agent, url) = (agent.clone(), url.clone());
        std::thread::spawn(move || {
            let body = serde_json::json!({"prompt": "Once upon a time", "max_tokens": 1500, "stream": true});
            let _ =
                agent.post(&format!("{url}v1/completions")).send_json(body).map(|mut r| r.body_mut().read_to_string());
        })
    };
    wait_for("the sequence's cold-pool file", || (cold_files(&cold) > 0).then_some(()));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(app.0.id() as i32, libc::SIGTERM) }, 0);
    let status = wait_for("the app to exit", || app.0.try_wait().unwrap());
    assert!(status.success(), "{status:?}");
    assert_eq!(cold_files(&cold), 0, "no cold-pool file is left");
    streaming.join().unwrap();
    drop(taken);
}
