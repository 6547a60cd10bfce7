//! The protobuf codec every generated client and server uses (`build.rs` names it as `codec_path`):
//! prost's, with 1 KiB buffers instead of tonic's default 8 KiB.
//!
//! Each call holds its encode and decode buffers until its stream ends, on the client and on the server, and
//! the messages of these APIs are small (a NodePublishVolume with its volume context is a few hundred
//! bytes). A simulated cluster keeps tens of thousands of calls in flight (bench/RESULTS.md, issue #28). A
//! larger message costs no more copies: prost reserves its encoded length before writing, and the decoder
//! reserves a message's length from its header.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::ProstCodec;

/// The buffer each encoder and decoder starts with.
const BUFFER_SIZE: usize = 1024;
/// tonic's default: how much a streaming response gathers before it is sent.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with small starting buffers.
#[derive(Debug, Clone, Copy)]
pub struct SmallBufferCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SmallBufferCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for SmallBufferCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::new(BUFFER_SIZE, YIELD_THRESHOLD))
    }
}

/// A unary call with its request message on the heap. A generated client's method keeps its message
/// inline in the call's future several times over (a CreateContainerRequest is 2.4 KB, the future of
/// `create_container` 13 KB), and a simulated node keeps a call like it in flight for each pod it starts
/// (issue #28). Sent on `channel` to `path` (`/package.Service/Method`), the same bytes the generated
/// client sends; the request's metadata (a `grpc-timeout`) goes with it.
pub async fn unary_boxed<M, R>(
    channel: tonic::transport::Channel,
    path: &'static str,
    request: tonic::Request<Box<M>>,
) -> Result<R, tonic::Status>
where
    M: prost::Message + Send + 'static,
    R: prost::Message + Default + Send + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    // The generated clients' words for a channel that cannot take the call.
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
    let path = http::uri::PathAndQuery::from_static(path);
    let codec = SmallBufferCodec::<Box<M>, R>::default();
    let response = grpc.unary(request, path, codec).await?;
    Ok(response.into_inner())
}
