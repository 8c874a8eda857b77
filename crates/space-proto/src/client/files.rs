//! Files: streamed reads and writes, stat, list, mkdir, remove, rename, chmod, and watches.

use super::*;

impl GuestClient {
    /// Streams a file's bytes.
    pub async fn read_file(&self, path: &str) -> Result<FileReader> {
        let pq = path_query(routes::FILES, path, &[])?;
        let req = Request::builder()
            .method(Method::GET)
            .uri(self.uri(&pq))
            .body(empty_body())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.send(req).await?;
        Ok(FileReader {
            body: resp.into_body(),
        })
    }

    /// Reads a whole file into memory.
    pub async fn read_file_bytes(&self, path: &str) -> Result<Bytes> {
        let mut reader = self.read_file(path).await?;
        let mut out = BytesMut::new();
        while let Some(chunk) = reader.chunk().await? {
            out.extend_from_slice(&chunk);
        }
        Ok(out.freeze())
    }

    /// Writes a file from memory. The guest writes a temporary file next to the target and
    /// renames it into place, so readers never see a partial file.
    pub async fn write_file(
        &self,
        path: &str,
        data: impl Into<Bytes>,
        options: WriteOptions,
    ) -> Result<FileStat> {
        self.write_file_body(path, full_body(data.into()), options)
            .await
    }

    /// Writes a file from a stream of chunks. If the stream yields an error the upload is
    /// aborted and the guest leaves the target untouched.
    pub async fn write_file_stream<S>(
        &self,
        path: &str,
        stream: S,
        options: WriteOptions,
    ) -> Result<FileStat>
    where
        S: Stream<Item = io::Result<Bytes>> + Send + 'static,
    {
        let body = StreamBody::new(stream.map(|item| {
            item.map(BodyFrame::data)
                .map_err(|e| Box::new(e) as BoxError)
        }));
        self.write_file_body(path, body.boxed_unsync(), options)
            .await
    }

    async fn write_file_body(
        &self,
        path: &str,
        body: ReqBody,
        options: WriteOptions,
    ) -> Result<FileStat> {
        let mut extra = vec![("parents", options.create_parents.to_string())];
        if let Some((uid, gid)) = options.owner {
            extra.push(("owner", format!("{uid}:{gid}")));
        }
        if let Some(mode) = options.mode {
            extra.push(("mode", format!("{mode:o}")));
        }
        if options.in_place {
            extra.push(("in_place", "true".into()));
        }
        if let Some(p) = &options.clear_xattrs {
            extra.push(("clear_xattrs", p.clone()));
        }
        if options.xattrs.len() > MAX_XATTRS {
            return Err(ClientError::Invalid(ProtoError::invalid(format!(
                "at most {MAX_XATTRS} extended attributes may be set at once"
            ))));
        }
        for (name, value) in &options.xattrs {
            validate_xattr(name, value).map_err(ClientError::Invalid)?;
        }
        let xattr_keys: Vec<String> = options
            .xattrs
            .keys()
            .map(|k| format!("xattr.{k}"))
            .collect();
        for (key, value) in xattr_keys.iter().zip(options.xattrs.values()) {
            extra.push((key.as_str(), value.clone()));
        }
        let pq = path_query(routes::FILES, path, &extra)?;
        let req = Request::builder()
            .method(Method::PUT)
            .uri(self.uri(&pq))
            .header(http::header::CONTENT_TYPE, "application/octet-stream")
            .body(body)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.send(req).await?;
        let bytes = read_limited(resp.into_body(), MAX_JSON_BODY).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol(format!("invalid JSON answer: {e}")))
    }

    /// Metadata of a path (symlinks are not followed).
    pub async fn stat(&self, path: &str) -> Result<FileStat> {
        self.get_json(&path_query(routes::STAT, path, &[])?).await
    }

    /// Entries of a directory, sorted by name.
    pub async fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        let listing: DirListing = self.get_json(&path_query(routes::LIST, path, &[])?).await?;
        Ok(listing.entries)
    }

    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<FileStat> {
        self.mkdir_owned(path, parents, None).await
    }

    /// [`GuestClient::mkdir`], the directories it creates owned by `owner` (uid, gid).
    pub async fn mkdir_owned(
        &self,
        path: &str,
        parents: bool,
        owner: Option<(u32, u32)>,
    ) -> Result<FileStat> {
        validate_path(path).map_err(ClientError::Invalid)?;
        let req = MkdirRequest {
            path: path.into(),
            parents,
            mode: None,
            owner,
        };
        self.post_json(routes::MKDIR, &req).await
    }

    pub async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        validate_path(path).map_err(ClientError::Invalid)?;
        let req = RemoveRequest {
            path: path.into(),
            recursive,
        };
        let _: serde_json::Value = self.post_json(routes::REMOVE, &req).await?;
        Ok(())
    }

    pub async fn rename(&self, from: &str, to: &str) -> Result<FileStat> {
        validate_path(from).map_err(ClientError::Invalid)?;
        validate_path(to).map_err(ClientError::Invalid)?;
        let req = RenameRequest {
            from: from.into(),
            to: to.into(),
        };
        self.post_json(routes::RENAME, &req).await
    }

    pub async fn chmod(&self, path: &str, mode: u32) -> Result<FileStat> {
        validate_path(path).map_err(ClientError::Invalid)?;
        let req = ChmodRequest {
            path: path.into(),
            mode,
        };
        self.post_json(routes::CHMOD, &req).await
    }

    /// Watches a directory. Returns once the watch is in place, so anything that changes
    /// afterwards is reported. Dropping the stream ends the watch in the guest.
    pub async fn watch(&self, path: &str, recursive: bool) -> Result<WatchStream> {
        let pq = path_query(routes::WATCH, path, &[("recursive", recursive.to_string())])?;
        let req = Request::builder()
            .method(Method::GET)
            .uri(self.uri(&pq))
            .body(empty_body())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.send(req).await?;
        Ok(WatchStream {
            frames: FrameReader::new(resp.into_body()),
        })
    }
}

/// A file's bytes as they arrive.
pub struct FileReader {
    body: Incoming,
}

impl FileReader {
    /// The next chunk; `None` at the end of the file.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>> {
        loop {
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if !data.is_empty() {
                            return Ok(Some(data));
                        }
                    }
                }
                Some(Err(e)) => return Err(ClientError::from_hyper(e)),
                None => return Ok(None),
            }
        }
    }
}

impl Stream for FileReader {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        if !data.is_empty() {
                            return Poll::Ready(Some(Ok(data)));
                        }
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Some(Err(ClientError::from_hyper(e))))
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Changes under a watched directory.
pub struct WatchStream {
    frames: FrameReader,
}

impl WatchStream {
    /// The next event; `None` if the guest ended the watch (e.g. the directory was removed).
    pub async fn next(&mut self) -> Result<Option<WatchEvent>> {
        match self.frames.next().await? {
            None => Ok(None),
            Some(f) if f.kind == FrameKind::Event => {
                f.parse().map(Some).map_err(ClientError::from_frame)
            }
            Some(f) if f.kind == FrameKind::Error => Err(error_frame(&f)),
            Some(f) => Err(ClientError::Protocol(format!(
                "unexpected {:?} record in watch stream",
                f.kind
            ))),
        }
    }
}
