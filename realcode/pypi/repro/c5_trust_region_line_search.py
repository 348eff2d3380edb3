# TGL201 FP: TRPO/NPG: the old distribution and the line-search KL under no_grad are part of the update step.
import torch
import torch.nn.functional as F
from torch.distributions import kl_divergence


class TRPO(torch.nn.Module):
    def _update_with_batch(self, batches, repeat):
        for _ in range(repeat):
            for minibatch in batches:
                dist = self.policy(minibatch).dist
                actor_loss = -(dist.log_prob(minibatch.act) * minibatch.adv).mean()
                flat_grads = self._get_flat_grad(actor_loss, self.policy.actor, retain_graph=True).detach()
                with torch.no_grad():
                    old_dist = self.policy(minibatch).dist          # TGL201 reported (trpo.py:145)
                kl = kl_divergence(old_dist, dist).mean()
                flat_kl_grad = self._get_flat_grad(kl, self.policy.actor, create_graph=True)
                direction = -self._conjugate_gradients(flat_grads, flat_kl_grad, nsteps=10)
                with torch.no_grad():
                    self._set_from_flat_params(self.policy.actor, direction)
                    new_dist = self.policy(minibatch).dist          # TGL201 reported (trpo.py:171, npg.py:176)
                    kl = kl_divergence(old_dist, new_dist).mean()
                for _ in range(self.optim_critic_iters):
                    value = self.critic(minibatch.obs).flatten()
                    vf_loss = F.mse_loss(minibatch.returns, value)
                    self.optim.step(vf_loss)
