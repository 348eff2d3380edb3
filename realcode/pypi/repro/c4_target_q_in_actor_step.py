# TGL201 FP: critic Q-values under no_grad are the actor's training target in the same update (SAC).
import torch


class DiscreteSAC(torch.nn.Module):
    def _update_with_batch(self, obs, act, target_q):
        current_q1 = self.critic(obs).gather(1, act).flatten()
        self.critic_optim.zero_grad()
        ((current_q1 - target_q) ** 2).mean().backward()
        self.critic_optim.step()

        dist = self.policy(obs)
        with torch.no_grad():
            q = self.critic(obs)                      # TGL201 reported: part of the actor step
        actor_loss = -(dist.probs * q).sum(-1).mean()
        self.policy_optim.zero_grad()
        actor_loss.backward()
        self.policy_optim.step()
