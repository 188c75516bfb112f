//! Triton's trace files: the JSON arrays `--trace-config triton,file=F` writes, with Triton's
//! `log-frequency` rotation, written by one thread that owns them.
//!
//! ```text
//! traced request done ─► TraceFile::add(group, log_frequency) ─► bounded channel (full ⇒ dropped,
//!                         (a root trace and its children)          counted) ─► writer thread:
//!   Batches::add ─► frequency 0: keep until close ─────────────────► F        "[" g1 "," g2 … "]"
//!               └─► frequency N: every N groups ────────────────────► F.0, F.1, … one array each
//!   Batches::close (shutdown, or every sender gone) ─► the rest: F.<next> (N > 0) or F, then "]"
//! ```
//!
//! As in Triton, the unit of `log-frequency` is a trace with its children (an ensemble's steps,
//! BLS calls): they land in the same file. A change of frequency through the settings API
//! first writes what was collected under the old one, as Triton does when it replaces a trace
//! setting. With frequency 0 nothing reaches the disk before shutdown.

use std::fs::File;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

/// Groups waiting for the writer thread; beyond this, new ones are dropped (and counted).
const QUEUE: usize = 4096;

/// A write the writer thread performs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum FileWrite {
    /// A whole index file `F.<n>`: one JSON array.
    Index(u64, String),
    /// Groups appended to the main file `F`; `first` opens it (with `[`), else a `,` goes first.
    Main { first: bool, text: String },
    /// The main file's closing `]`.
    CloseMain,
}

/// What the writer has collected and written so far: the pure core of the rotation.
#[derive(Debug, Default)]
pub(crate) struct Batches {
    /// Serialized groups not yet written.
    pending: Vec<String>,
    /// The frequency `pending` was collected under.
    frequency: u64,
    next_index: u64,
    main_open: bool,
}

impl Batches {
    /// Takes one group collected under `frequency`; returns what to write now.
    pub(crate) fn add(&mut self, group: String, frequency: u64) -> Vec<FileWrite> {
        let mut writes = Vec::new();
        if frequency != self.frequency {
            writes.extend(self.flush());
            self.frequency = frequency;
        }
        self.pending.push(group);
        if frequency > 0 && self.pending.len() as u64 >= frequency {
            writes.extend(self.flush());
        }
        writes
    }

    /// Everything left, at shutdown.
    pub(crate) fn close(&mut self) -> Vec<FileWrite> {
        let mut writes = self.flush();
        if self.main_open {
            writes.push(FileWrite::CloseMain);
            self.main_open = false;
        }
        writes
    }

    fn flush(&mut self) -> Vec<FileWrite> {
        if self.pending.is_empty() {
            return Vec::new();
        }
        let text = std::mem::take(&mut self.pending).join(",");
        if self.frequency > 0 {
            let index = self.next_index;
            self.next_index += 1;
            vec![FileWrite::Index(index, format!("[{text}]"))]
        } else {
            let first = !self.main_open;
            self.main_open = true;
            vec![FileWrite::Main { first, text }]
        }
    }
}

enum Command {
    Group { text: String, frequency: u64 },
    Close(tokio::sync::oneshot::Sender<()>),
}

/// The handle request paths and shutdown use; the writer thread owns the files.
#[derive(Debug)]
pub struct TraceFile {
    tx: SyncSender<Command>,
    dropped: AtomicU64,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Command::Group { .. } => "Group",
            Command::Close(_) => "Close",
        })
    }
}

impl TraceFile {
    /// Starts the writer thread for the files at `path` (`F`, `F.0`, ...).
    pub fn start(path: &str) -> Result<TraceFile, String> {
        let (tx, rx) = sync_channel(QUEUE);
        let path = path.to_string();
        std::thread::Builder::new()
            .name("trace-file".into())
            .spawn(move || writer_thread(&path, rx))
            .map_err(|e| format!("cannot start the trace file writer: {e}"))?;
        Ok(TraceFile {
            tx,
            dropped: AtomicU64::new(0),
        })
    }

    /// Queues one trace group (a trace and its children, serialized) collected under
    /// `frequency`; never blocks: a full queue drops it (logged, counted).
    pub fn add(&self, text: String, frequency: u64) {
        match self.tx.try_send(Command::Group { text, frequency }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!("the trace file writer is behind: traces are being dropped");
                }
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Writes what is left and closes the main file's array; resolves once it is on disk.
    pub async fn close(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        let tx = self.tx.clone();
        // The queue may be full: hand the command over off the async threads.
        let sent = tokio::task::spawn_blocking(move || tx.send(Command::Close(done)).is_ok());
        if matches!(sent.await, Ok(true)) {
            let _ = wait.await;
        }
    }
}

fn writer_thread(path: &str, rx: Receiver<Command>) {
    let mut batches = Batches::default();
    let mut main: Option<File> = None;
    let mut warned = false;
    let mut apply = |writes: Vec<FileWrite>, main: &mut Option<File>| {
        for write in writes {
            if let Err(e) = perform(path, write, main)
                && !warned
            {
                warned = true;
                tracing::warn!("cannot write the trace file '{path}': {e}");
            }
        }
    };
    loop {
        match rx.recv() {
            Ok(Command::Group { text, frequency }) => {
                let writes = batches.add(text, frequency);
                apply(writes, &mut main);
            }
            // Closed files stay closed: a trace finishing later is not written.
            Ok(Command::Close(done)) => {
                let writes = batches.close();
                apply(writes, &mut main);
                let _ = done.send(());
                return;
            }
            Err(_) => {
                let writes = batches.close();
                apply(writes, &mut main);
                return;
            }
        }
    }
}

fn perform(path: &str, write: FileWrite, main: &mut Option<File>) -> std::io::Result<()> {
    match write {
        FileWrite::Index(n, text) => std::fs::write(format!("{path}.{n}"), text),
        FileWrite::Main { first, text } => {
            if first || main.is_none() {
                let mut file = File::create(path)?;
                file.write_all(b"[")?;
                file.write_all(text.as_bytes())?;
                *main = Some(file);
                Ok(())
            } else if let Some(file) = main {
                file.write_all(b",")?;
                file.write_all(text.as_bytes())
            } else {
                Ok(())
            }
        }
        FileWrite::CloseMain => match main.take() {
            Some(mut file) => {
                file.write_all(b"]")?;
                file.flush()
            }
            None => Ok(()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: u32) -> String {
        format!("{{\"id\":{n}}}")
    }

    #[test]
    fn frequency_zero_keeps_everything_for_one_array_at_close() {
        let mut b = Batches::default();
        assert!(b.add(g(1), 0).is_empty());
        assert!(b.add(g(2), 0).is_empty());
        assert_eq!(
            b.close(),
            [
                FileWrite::Main {
                    first: true,
                    text: format!("{},{}", g(1), g(2))
                },
                FileWrite::CloseMain
            ]
        );
        assert!(b.close().is_empty(), "closing twice writes nothing more");
    }

    #[test]
    fn frequency_n_writes_an_index_file_every_n_groups_and_the_rest_at_close() {
        let mut b = Batches::default();
        assert!(b.add(g(1), 2).is_empty());
        assert_eq!(
            b.add(g(2), 2),
            [FileWrite::Index(0, format!("[{},{}]", g(1), g(2)))]
        );
        assert!(b.add(g(3), 2).is_empty());
        assert_eq!(
            b.add(g(4), 2),
            [FileWrite::Index(1, format!("[{},{}]", g(3), g(4)))]
        );
        assert!(b.add(g(5), 2).is_empty());
        assert_eq!(b.close(), [FileWrite::Index(2, format!("[{}]", g(5)))]);
    }

    #[test]
    fn a_new_frequency_first_writes_what_the_old_one_collected() {
        let mut b = Batches::default();
        b.add(g(1), 0);
        assert_eq!(
            b.add(g(2), 3),
            [FileWrite::Main {
                first: true,
                text: g(1)
            }]
        );
        assert_eq!(b.add(g(3), 0), [FileWrite::Index(0, format!("[{}]", g(2)))]);
        assert_eq!(
            b.close(),
            [
                FileWrite::Main {
                    first: false,
                    text: g(3)
                },
                FileWrite::CloseMain
            ]
        );
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "nereid-trace-file-{}-{name}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn the_writer_thread_writes_valid_json_arrays() {
        let dir = scratch("main");
        let path = dir.join("trace.json");
        let file = TraceFile::start(path.to_str().unwrap()).unwrap();
        file.add(g(1), 0);
        file.add(g(2), 0);
        file.close().await;
        file.add(g(3), 0);
        file.close().await;
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            format!("[{},{}]", g(1), g(2)),
            "written once, at the first close"
        );

        let rotated = dir.join("rotated.json");
        let file = TraceFile::start(rotated.to_str().unwrap()).unwrap();
        for n in 1..=3 {
            file.add(g(n), 2);
        }
        file.close().await;
        let read = |n: u32| std::fs::read_to_string(format!("{}.{n}", rotated.display())).unwrap();
        assert_eq!(read(0), format!("[{},{}]", g(1), g(2)));
        assert_eq!(read(1), format!("[{}]", g(3)));
        assert!(!rotated.exists(), "rotation never writes the main file");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
