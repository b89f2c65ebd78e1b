//! A small tmpfs mounted for one test: a disk that fills up on demand.

use std::io::Write;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// A tmpfs of a fixed size on a fresh temp dir, unmounted (and the dir deleted) on drop,
/// also when the test panics. Mounting needs root (`cargo xtask test` runs as root); a
/// test that cannot mount fails with the reason, it never passes without the disk.
#[derive(Debug)]
pub struct Tmpfs {
    dir: Option<tempfile::TempDir>,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size_mib` MiB.
    pub fn mount(size_mib: u32) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("fjord-tmpfs-").tempdir()?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .context("could not run mount (a full-disk test mounts a tmpfs, as root)")?;
        if !output.status.success() {
            bail!(
                "mounting a {size_mib} MiB tmpfs on {} failed (a full-disk test needs root): {}",
                dir.path().display(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(Self { dir: Some(dir) })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("invariant: set until drop").path()
    }

    /// Writes `name` until the filesystem is full (the write fails with ENOSPC); returns
    /// the bytes written. Deleting the file frees them again.
    pub fn fill(&self, name: &str) -> Result<u64> {
        let path = self.path().join(name);
        let mut file = std::fs::File::create(&path)?;
        let mut written = 0u64;
        // Large writes first, then single bytes: the last page's slack is used up too.
        for chunk in [1 << 20, 4096, 1] {
            let buf = vec![0xAB_u8; chunk];
            loop {
                match file.write(&buf) {
                    Ok(0) => break,
                    Ok(n) => written += n as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                    Err(e) => return Err(e).with_context(|| format!("filling {}", path.display())),
                }
            }
        }
        Ok(written)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        let unmounted = Command::new("umount").arg(dir.path()).status().is_ok_and(|s| s.success())
            // Still in use (a broker's files not yet closed): detach it now, freed once closed.
            || Command::new("umount").arg("-l").arg(dir.path()).status().is_ok_and(|s| s.success());
        if !unmounted {
            eprintln!("could not unmount the test tmpfs at {}", dir.path().display());
            // Deleting the files of a still-mounted tmpfs is harmless; the dir stays.
        }
        drop(dir);
    }
}
