import { ServiceError } from "../domain/errors.ts";
import { ModelServiceError } from "../models/model-service.ts";

/** Maps a model service failure to the gateway's error; context rejections are the client's, the rest are 502. */
export function modelServiceFailure(err: unknown): ServiceError {
  if (!(err instanceof ModelServiceError)) {
    return new ServiceError("model_invalid_response", "The model service failed unexpectedly.");
  }
  switch (err.kind) {
    case "timeout":
      return new ServiceError("model_timeout", `The model service did not answer in time: ${err.message}`);
    case "not_ready":
      return new ServiceError("model_not_ready", err.message);
    case "context_rejected":
      return new ServiceError("context_rejected", `The model rejected the request's context: ${err.message}`);
    case "invalid_response":
      return new ServiceError("model_invalid_response", `The model service returned an invalid response: ${err.message}`);
    default:
      return new ServiceError("model_unavailable", `The model service is unavailable: ${err.message}`);
  }
}
